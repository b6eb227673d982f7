"""What-if overrides of the planner's calibrated numbers, for the validation scripts
(`scripts/plan_validate_1gpu.py report`, `scripts/plan_validate_multi_gpu.py`): each set by hand on every shard,
to see how far a prediction moves with it. A sensitivity check, never a prediction: the planner itself takes these numbers from
`plan calibrate`'s probes (`calibrate.record_prefix_prefills`, `record_serving_step`, `record_stream_rate`).
"""

from __future__ import annotations

import argparse

# flag -> (metavar, what it sets: "{}" stands for the value)
WHAT_IFS = {
    "prefix_factor": ("K", "attention over a cached prefix as {} x attention within the new tokens "
                           "(ShardClock.prefix_factor)"),
    "stream_tokens_per_s": ("R", "the tokenizer manager's stream as {} tokens/s (steps.stream_tokens_per_s, "
                                 "sim.deliver)"),
    "host_ms_per_request": ("MS", "the scheduler's host time as {} ms per running request per decode step "
                                  "(ShardClock.host_ms)"),
}


def add_what_if_args(parser: argparse.ArgumentParser) -> None:
    """`--prefix-factor K`, `--stream-tokens-per-s R` and `--host-ms-per-request MS` (each None: calibrated)."""
    for name, (metavar, what) in WHAT_IFS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=None, metavar=metavar,
                            help=f"what-if: take {what.format(metavar)} on every shard instead of the calibrated value")


def apply_what_if(args: argparse.Namespace) -> None:
    """Set the planner's numbers that `args` names (process-wide) and print one line for each."""
    import sgl_sidp.plan.planner as planner
    from sgl_sidp.plan.steps import ShardClock

    k, rate, host = args.prefix_factor, args.stream_tokens_per_s, args.host_ms_per_request
    if k is not None:
        ShardClock.prefix_factor = property(lambda self: k)
    if rate is not None:
        planner.stream_tokens_per_s = lambda *a, **kw: rate
    if host is not None:
        ShardClock.host_ms = lambda self, batch: host * batch
    for name, (metavar, what) in WHAT_IFS.items():
        value = getattr(args, name)
        if value is not None:
            print(f"What-if: {what.format(f'{value:g}')} on every shard (set by hand: a sensitivity check, not a "
                  "prediction)\n")
