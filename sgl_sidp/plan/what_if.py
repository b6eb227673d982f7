"""What-if overrides of the planner's calibrated numbers, for the validation scripts
(`python -m sgl_sidp.bench.validate_1gpu report`, `python -m sgl_sidp.bench.validate`): each set by hand on every shard,
to see how far a prediction moves with it. A sensitivity check, never a prediction: the planner itself takes these numbers from
`plan calibrate`'s probes (`calibrate.record_prefix_prefills`, `record_serving_step`, `record_stream_rate`).

A `WhatIf` is a parameter of `planner.plan` / `planner.plan_requests`, which hand it to every shard's
`steps.ShardClock` (the prefix factor, the host time) and read the stream rate from it: nothing is patched, and a
plan without one (`NO_WHAT_IF`) is the calibrated prediction.
"""

from __future__ import annotations

import argparse
import dataclasses

# flag -> (metavar, what it sets: "{}" stands for the value)
WHAT_IFS = {
    "prefix_factor": ("K", "attention over a cached prefix as {} x attention within the new tokens "
                           "(ShardClock.prefix_factor)"),
    "stream_tokens_per_s": ("R", "the tokenizer manager's stream as {} tokens/s (steps.stream_tokens_per_s, "
                                 "sim.deliver)"),
    "host_ms_per_request": ("MS", "the scheduler's host time as {} ms per running request per decode step "
                                  "(ShardClock.host_ms)"),
    "prefill_factor": ("F", "a served prefill's linears and attention as {} x the calibration's timing "
                            "(steps.PREFILL_SUSTAINED_FACTOR)"),
}


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """Numbers set by hand in place of the calibrated ones, on every shard; None: the calibrated value.

    Attributes:
        prefix_factor: attention over a cached prefix per token pair, as a multiple of attention within the new
            tokens (dimensionless; `ShardClock.prefix_factor`).
        stream_tokens_per_s: the tokens per second SGLang's tokenizer manager streams to clients (tokens/s;
            `steps.stream_tokens_per_s`, `sim.deliver`).
        host_ms_per_request: the scheduler's host time per running request per decode step (ms;
            `ShardClock.host_ms`).
        prefill_factor: a served prefill forward's per-token terms (linears, attention) as a multiple of the
            calibration's short timing of them (dimensionless; `steps.PREFILL_SUSTAINED_FACTOR`, 1.028 on H200): how
            far a replay near saturation moves with a forward's price.
    """

    prefix_factor: float | None = None
    stream_tokens_per_s: float | None = None
    host_ms_per_request: float | None = None
    prefill_factor: float | None = None


#: no what-if: every number calibrated
NO_WHAT_IF = WhatIf()


def add_what_if_args(parser: argparse.ArgumentParser) -> None:
    """`--prefix-factor K`, `--stream-tokens-per-s R`, `--host-ms-per-request MS` and `--prefill-factor F` (each
    None: calibrated)."""
    for name, (metavar, what) in WHAT_IFS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=None, metavar=metavar,
                            help=f"what-if: take {what.format(metavar)} on every shard instead of the calibrated value")


def what_if_from_args(args: argparse.Namespace) -> WhatIf:
    """The `WhatIf` of the flags `add_what_if_args` added to `args`, printing one line for each number it sets (to
    pass to `planner.plan`)."""
    what_if = WhatIf(**{name: getattr(args, name) for name in WHAT_IFS})
    for name, (metavar, what) in WHAT_IFS.items():
        value = getattr(what_if, name)
        if value is not None:
            print(f"What-if: {what.format(f'{value:g}')} on every shard (set by hand: a sensitivity check, not a "
                  "prediction)\n")
    return what_if
