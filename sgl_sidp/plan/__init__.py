"""The planner (`python -m sgl_sidp.plan`): every configuration of a model on N GPUs, predicted from measurements on
one GPU (issue 21; being built).

- `configs`: the configurations (vanilla TP x DP, DP attention, ZeroDP, SiDP, Shift), each one's per-GPU shard shapes
  (what one GPU computes, as SGLang's `--json-model-override-args` for a one-GPU calibration run), weights and KV
  tokens per GPU (`sgl_sidp.calibration.memory`).

Every figure it gives is a prediction and is labelled so.
"""
