"""The planner (`python -m sgl_sidp.plan`): every configuration of a model on N GPUs, predicted from measurements on
one GPU. Every figure it gives is a prediction and is labelled so.

- `configs`: the configurations (vanilla TP x DP, DP attention, ZeroDP, SiDP WaS/CaS/auto, Shift), each one's per-GPU
  shard shapes (what one GPU computes, as SGLang's `--json-model-override-args` for a one-GPU calibration run),
  weights and KV tokens per GPU (`sgl_sidp.calibration.memory`, checked against SGLang's logs);
- `technique`: what the planner asks of a technique (`Technique`: its names and options, launch flags, shards,
  memory, how its forwards are composed, its decisions), one object each: vanilla TP x DP and DP attention in
  `vanilla`, ZeroDP, SiDP and Shift in their feature folders (`sgl_sidp/<feature>/planner.py`, `Feature.planner`);
  nothing else in the planner branches on a technique's name;
- `calibrate` (`python -m sgl_sidp.plan calibrate`): times every shard a model's configurations need on the GPU at
  hand, and a request's time outside forwards;
- `comm`: the interconnect table (latency + bytes / bandwidth per collective and GPU count), bundled per GPU kind or
  measured by `python -m sgl_sidp.plan measure-comm`;
- `steps`: each technique's step times from its shards' calibrations, the collectives and copies it adds, and the
  decisions it makes with the features' cost model (`sgl_sidp.calibration.cost`);
- `sim_reference`: the scheduler simulation written plainly, one iteration at a time: start here;
- `sim`: its optimised equivalent, the discrete-event simulation of SGLang's scheduler the planner runs (continuous
  batching, chunked prefill, KV admission and retraction, the radix cache), tested float for float against
  `sim_reference`;
- `planner`: the library: `plan` / `plan_requests` predict every configuration and rank them, `table` and
  `write_png` render the result, `launch_flags` gives the flags the launcher's auto mode starts the winner with;
- `server_flags`: the SGLang flags every configuration runs with alike (`ServerFlags`: the prefill chunk and budget,
  the memory fraction, the largest decode graph), read off a command line or SGLang's parsed flags;
- `__main__`: the command (`python -m sgl_sidp.plan`: argument parsing and printing, the table, `--json`, `--png`).

Measured against: `benchmarks/results/plan/` (one H200) and `benchmarks/results/plan_multi_gpu/`.
"""
