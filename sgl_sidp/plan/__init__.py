"""The planner (`python -m sgl_sidp.plan`, issue 21; being built): every configuration of a model on N GPUs, predicted
from measurements on one GPU. Every figure it gives is a prediction and is labelled so.

Built so far (CPU-tested):

- `configs`: the configurations (vanilla TP x DP, DP attention, ZeroDP, SiDP, Shift), each one's per-GPU shard shapes
  (what one GPU computes, as SGLang's `--json-model-override-args` for a one-GPU calibration run), weights and KV
  tokens per GPU (`sgl_sidp.calibration.memory`, checked against SGLang's logs);
- `comm`: the interconnect table (latency + bytes / bandwidth per collective and GPU count) and `measure-comm`'s
  measuring path;
- `sim`: a discrete-event simulation of SGLang's scheduler for one DP replica (continuous batching, chunked prefill,
  KV admission and retraction, the radix cache);
- `steps`: step times of vanilla TP x DP from a shard's calibration plus its all-reduces;
- `__main__`: the command (table, `--json`, `--png`), predicting what is modelled and calibrated and saying why the
  rest is not (validated for TP1 on one H200: `benchmarks/results/plan/`).

Not yet: `plan calibrate` (the one-GPU calibration of every shard) and `plan measure-comm` as commands, the step times
of DP attention, ZeroDP, SiDP and Shift, a per-request overhead term, and `--sidp-mode auto`.
"""
