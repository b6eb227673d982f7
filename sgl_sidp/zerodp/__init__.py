"""ZeroDP: MoE expert weights shared by DP replicas, pulled just in time from a source over NVLink.

A feature on three mechanisms: `sgl_sidp.peer` (the source's expert memory, shared over VMM),
`sgl_sidp.prefetch` (the sink's slot ring) and `sgl_sidp.calibration` (what hides behind a forward).

- `settings`: its flags (`--zerodp-*`).
- `feature`: its checks before any GPU work, SGLang defaults and start-up line (`FEATURE`).
- `policy`: which tensors are experts, the offload set of each sink, source/sink GPU pairs (pure Python).
- `runtime`: the per-process state and SGLang hook bodies (`ZeroDPRuntime`).
- `router`: capacity-aware DP routing's choice (`pick_rank`).
"""
