"""Mechanism: how fast this node computes and copies, measured at start-up and cached; the cost model on it.

- `table`: `Calibration` (forward times per decode batch and prefill chunk, peer-copy rates) and
  `ExpectedBatch` (the load a decision is sized for).
- `cache`: where a calibration comes from (flag file > bundled table > disk cache > measured now),
  keyed by GPU, model shapes, TP size and SGLang version.
- `measure`: the start-up measurements on a running SGLang model runner (GPU only).
- `startup`: what a feature's hook calls once the scheduler is built: measure once per key, cache, log.
- `cost`: what fits behind what (copies behind a forward, capacity-bound decode), for any feature.
"""
