"""ZeroDP: MoE expert weights shared by DP replicas, pulled just in time from a source over NVLink.

- `plan`: manifests, the offload policy and the prefetch schedule (pure Python).
- `runtime`: the sink's double-buffered prefetcher (`SinkPrefetcher`).
- `transport`: VMM export/import of the source's expert memory (`ExpertExporter`, `ExpertImporter`).
- `engine`: the SGLang hook bodies (source/sink setup, MoE sync points, KV capacity log).
- `router`: capacity-aware DP routing (SGLang's `total_tokens` method, normalized by KV capacity).
- `preflight`: launcher-side checks (peer access) before any GPU memory is taken.
"""
