"""ZeroDP: MoE expert weights shared by DP replicas, pulled just in time from a source over NVLink.

A feature on two mechanisms: `sgl_sidp.peer` (the source's expert memory, shared over VMM) and
`sgl_sidp.prefetch` (the sink's double-buffered slot ring).

- `plan`: which tensors are experts, the offload policy, calibration, source/sink GPU pairs (pure Python).
- `engine`: the SGLang hook bodies (source/sink setup, MoE sync points, KV capacity log).
- `router`: capacity-aware DP routing (SGLang's `total_tokens` method, normalized by KV capacity).
"""
