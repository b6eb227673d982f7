"""Seconds per configuration the planner spends in the scheduler simulation (`sgl_sidp.plan.sim.simulate`).

    .venv/bin/python scripts/plan_sim_speed.py [--model-path ../shared/models/Qwen3-8B] [--gpus 1 2]
        [--workload trace:../shared/traces/AzureLLMInferenceTrace_code.csv ...] [--repeat 1]

Runs the planner (`sgl_sidp.plan.planner.plan`) on each workload and number of GPUs, timing every `simulate` call
it makes (one per predicted configuration), and prints one line per configuration: workload, GPUs, configuration
(DP replicas), simulated requests, seconds (best of --repeat), of which in the configuration's step-time functions
(`StepTimes.decode_ms`, `prefill_ms` and `decode_run`, timed in a second run; the rest is the simulation's own),
and the predicted total tokens/s. A speed check, not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
WORKLOADS = (f"trace:{SHARED / 'traces' / 'AzureLLMInferenceTrace_code.csv'}",
             f"trace:{SHARED / 'traces' / 'conversation_trace.jsonl'}", "offline:512:2048:256")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=str(SHARED / "models" / "Qwen3-8B"),
                    help="the model's folder, as `python -m sgl_sidp.plan --model-path` takes it "
                         "(default: ../shared/models/Qwen3-8B)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="numbers of GPUs to plan for (default: 1 2)")
    ap.add_argument("--workload", nargs="+", default=list(WORKLOADS),
                    help="`python -m sgl_sidp.plan` workload specs (default: the Azure code and Mooncake conversation "
                         "traces under ../shared/traces, and offline:512:2048:256)")
    ap.add_argument("--repeat", type=int, default=1, help="time each simulation this many times, keep the best")
    a = ap.parse_args()
    import sgl_sidp.plan.planner as planner  # here, so that --help answers without the planner
    from sgl_sidp.plan.sim import SimRequest, StepTimes

    original = planner.simulate
    # (configuration, replicas, requests, seconds, seconds in step times), one per `simulate` call: configurations
    # whose schedule is another's (`plan_requests`' twins) are not simulated, so each call names its own
    timings: list[tuple[str, int, int, float, float]] = []

    def clocked(times: StepTimes, spent: list[float]) -> StepTimes:
        """`times` with every call's seconds added to `spent[0]` (`decode_run` and `longest_row` kept, so the
        simulation takes the same path as in the planner)."""
        def timer(fn):
            if fn is None:
                return None

            def wrapped(*args):
                t0 = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    spent[0] += time.perf_counter() - t0
            return wrapped

        return StepTimes(timer(times.decode_ms), timer(times.prefill_ms), timer(times.decode_run), times.longest_row)

    def copies(requests):
        """Fresh copies of the planner's requests (their private blocks kept: `sim.PrivateBlocks`)."""
        return [type(r)(r.arrival_s, r.input_len, r.output_len, r.hash_ids, private_blocks=r.private_blocks)
                for r in requests]

    def timed(requests, replicas, route=None):
        config = sys._getframe(1).f_locals.get("c")  # the configuration `plan_requests` is predicting
        best, out = float("inf"), None
        for _ in range(a.repeat):
            fresh = copies(requests)
            reps = [type(p)(p.limits, p.times, log_tokens=p.tokens_log is not None) for p in replicas]
            t0 = time.perf_counter()
            original(fresh, reps, route)
            best = min(best, time.perf_counter() - t0)
            out = fresh
        spent = [0.0]
        original(copies(requests), [type(p)(p.limits, clocked(p.times, spent)) for p in replicas], route)
        names = [f.name for f in dataclasses.fields(SimRequest)]  # (slotted: no __dict__ to copy)
        for r, f in zip(requests, out):  # the planner reads the results
            for name in names:
                setattr(r, name, getattr(f, name))
        for p, rep in zip(replicas, reps):  # and the replicas' tokens (`sim.deliver`)
            p.tokens_log = rep.tokens_log
        timings.append((getattr(config, "name", "?"), len(replicas), len(requests), best, spent[0]))
        return requests

    planner.simulate = timed
    try:
        for spec in a.workload:
            for n in a.gpus:
                timings.clear()
                result = planner.plan(a.model_path, n, "H200", spec)
                tok_s = {r.name: r.total_tok_s for r in result["configurations"]}
                for name, dp, reqs, sec, in_times in timings:
                    print(f"{Path(spec).name:32s} gpus={n} {name:14s} replicas={dp} requests={reqs:6d} "
                          f"{sec:7.3f} s (step times {in_times:6.3f} s)  total_tok_s={tok_s.get(name)}", flush=True)
    finally:
        planner.simulate = original


if __name__ == "__main__":
    main()
