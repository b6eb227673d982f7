"""ZeroDP as the planner sees it (`sgl_sidp.plan.technique.Technique`): `zerodp_dp{d}[_tp{t}]`, MoE models, d replicas
of TP t, one source holding every expert and d - 1 sinks pulling their offloaded layers' routed experts each forward
from the source's HBM."""

from __future__ import annotations

import functools
import math
import weakref

from sgl_sidp.plan.configs import Configuration
from sgl_sidp.plan.technique import Technique


#: the context (tokens) of the decode steps a simulated replica's step line is fitted through (`ZeroDPTechnique.route`)
FIT_CONTEXT = 1024


class ZeroDPTechnique(Technique):
    name = "zerodp"
    patterns = (r"zerodp_dp(?P<dp>\d+)(?:_tp(?P<tp>\d+))?",)
    form = "zerodp_dpD[_tpT][_all|_pfN|_kvN]"  # none: the runtime's default policy (decode:1)
    options = {"all": "every MoE layer offloaded on the sinks (--zerodp-layers all)",
               "pf": "the policy sized for forwards of N prefill tokens (pfN: --zerodp-expected-batch prefill:N)",
               "kv": "the policy sized for a saturated cache of N-token sequences (kvN: --zerodp-expected-batch kv:N)"}
    valued = frozenset({"pf", "kv"})
    modeled_options = frozenset(options)

    def split_configurations(self, shapes, n_gpus, dp, tp):
        if dp == 1 or not shapes.moe_layers:
            return []
        return [Configuration(self.replica_name(dp, tp), self.name, dp, tp)]

    def launched_name(self, dp, tp_size, settings):
        """`zerodp_dpD[_tpT]` with the option the settings pick: `_all` (`--zerodp-layers all`), `_pfN`/`_kvN`
        (`--zerodp-expected-batch prefill:N|kv:N`); none for the default `decode:1`. A layer list or another decode
        batch has no name (None)."""
        name = self.replica_name(dp, tp_size)
        if settings.layers == "all":
            return f"{name}_all"
        if settings.layers != "auto":
            return None
        kind, _, size = settings.expected_batch.partition(":")
        return {"decode": name if size == "1" else None, "prefill": f"{name}_pf{size}",
                "kv": f"{name}_kv{size}"}.get(kind)

    def variants(self, c, context):
        """The capacity-bound policy at the workload's mean context, `<c>_kv<C>`, beside the default policy's `c`."""
        return [] if c.options else [f"{c.name}_kv{max(1, round(context))}"]

    def launch_flags(self, c, opts, b_th, shift_threshold):
        # its runtime policy picks the offload set with the same cost model (`choose_offload`)
        flags = super().launch_flags(c, opts, b_th, shift_threshold)
        if "all" in opts:
            return flags + ["--overlay-mode", "zerodp", "--zerodp-layers", "all"]
        expected = f"prefill:{opts['pf']}" if "pf" in opts else f"kv:{opts['kv']}" if "kv" in opts else None
        return flags + ["--overlay-mode", "zerodp"] + (["--zerodp-expected-batch", expected] if expected else [])

    def weight_bytes_per_gpu(self, c, shapes, elt, sink_offload, slots, chunk):
        """The source's (every weight) and a sink's, whose `sink_offload` layers' experts it pulls into `slots`
        slots."""
        full = shapes.weight_bytes(c.tp, c.tp, c.tp, elt)
        slot = elt * shapes.expert_params() // c.tp
        sink = shapes.weight_bytes(c.tp, c.tp, c.tp, elt, expertless=sink_offload)
        return {"source": full, "sink": sink + (slots * slot if sink_offload else 0)}

    def total_kv_tokens(self, c, kv):
        return kv["source"] + (c.dp - 1) * kv["sink"]

    # ------------------------------------------------------------------ step times
    # The source replica is vanilla; a sink (role "sink") pulls its offloaded layers' routed experts each forward: a
    # forward takes max(compute + the copies' measured slowdown, the copies at the in-forward copy rate, the source's
    # egress shared by its d - 1 sinks). The offloaded layers are those the runtime's policy picks for the
    # configuration's options (`choose_offload`).
    @property
    def model_attributes(self):
        return {"offload_layers": self.offload_layers,
                "choose_offload": lambda model: functools.partial(self.choose_offload, model)}

    def offload_layers(self, model) -> tuple[int, ...]:
        """The MoE layers a sink pulls (`choose_offload`; none before it)."""
        return model.decision("offload_layers", ())

    def choose_offload(self, model, vanilla_kv_bytes: float) -> tuple[int, ...]:
        """The offload set the runtime's policy (`policy.choose_plan`, the same function) picks for the configuration's
        options, for a sink whose KV pool holds `vanilla_kv_bytes` without offloading: `_all` every MoE layer; `_kvN`
        the count that maximizes capacity-bound decode tokens/s of N-token sequences; `_pfN` the most layers whose
        copies hide behind a forward of N prefill tokens; none (the default `decode:1`) those that hide behind a
        batch-1 decode step. The copies run at the interconnect's peer-copy rate (`model.copy_gbps`) and, beside a
        forward, at the calibrated fraction of it (`model.copy_rate`). Set on `model` (which forgets the forwards
        computed before, with another set) and returned."""
        from sgl_sidp.calibration.cost import KVModel
        from sgl_sidp.calibration.table import ExpectedBatch
        from sgl_sidp.peer.manifest import TensorSpec
        from sgl_sidp.zerodp.policy import choose_plan

        s, c = model.shapes, model.config
        opts = c.option_values
        # one tensor per layer stands for its experts (w13 and w2 travel together by default)
        manifest = [TensorSpec(lid, "w13_weight", (), "", model.elt * s.expert_params() // c.tp) for lid in s.moe_layers]
        forced = s.moe_layers if "all" in opts else None
        kv = budget = None
        if "kv" in opts:
            kv = KVModel(vanilla_kv_bytes, model.clock.kv_bytes_per_token, opts["kv"], model.clock.cal)
        elif forced is None:
            expected = ExpectedBatch("prefill", opts["pf"]) if "pf" in opts else ExpectedBatch("decode", 1)
            budget = model.clock.cal.forward_ms(expected)
        plan = choose_plan(manifest, ("w13",), model.copy_gbps, budget, forced, kv=kv, rate_in_forward=model.copy_rate)
        return model.decide("offload_layers", plan.layers)

    def terms(self, model, size, role, variant, prefill=False):
        all_reduce = model._collective_ms("all_reduce", model.config.tp, size)
        if role == "sink":
            return (model.clock, 1, all_reduce, *model._stream_terms(prefill))
        return model.clock, 1, all_reduce, 0.0, 0.0, -math.inf

    def streamed_bytes(self, model):
        """A sink's offloaded experts."""
        return len(self.offload_layers(model)) * model.elt * model.shapes.expert_params() // model.config.tp

    def copy_gbps(self, model):
        """At the in-forward copy rate, or at the source's egress shared by its d - 1 sinks."""
        from sgl_sidp.plan.steps import SOURCE_EGRESS_GBPS

        readers = max(1, model.config.dp - 1)
        return min(model.copy_gbps * model.copy_rate, SOURCE_EGRESS_GBPS / readers)

    def replicas(self, model, kv):
        """The source, then d - 1 sinks."""
        from sgl_sidp.plan.steps import Replica

        return [Replica(model.step_times(), kv["source"])] + [Replica(model.step_times("sink"), kv["sink"])
                                                              for _ in range(model.config.dp - 1)]

    # ------------------------------------------------------------------ the planner
    def memory(self, c, model, shapes, free_before_load, mem_fraction_static, elt):
        """The sinks' offload set: chosen on `model` (`choose_offload`) for the KV pool a sink has without offloading;
        none without a model."""
        none = c.kv_tokens(shapes, free_before_load, mem_fraction_static, elt, sink_offload=())["sink"]
        layers = self.choose_offload(model, none * shapes.kv_bytes_per_token(c.tp, elt)) if model else ()
        return {"sink_offload": layers}

    def route(self, c):
        """ZeroDP's launcher sets `total_tokens` and its router (`zerodp.router.pick_rank`: the least full KV cache the
        prompt fits in among the replicas whose decode step it would not make much slower than the fastest's, else
        the fewest tokens), read from each simulated replica's load (`ReplicaSim.load`, current at the arrival, as the
        router's snapshot add-back makes it) and decode step line (through its steps at batch 1 and 64 at
        `FIT_CONTEXT` tokens, as the router fits the steps each scheduler timed)."""
        from sgl_sidp.zerodp.router import pick_rank

        fits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # replica -> its line, while it lives

        def fit(rep) -> tuple[float, float]:
            if rep not in fits:
                one, many = rep.times.decode_ms(1, FIT_CONTEXT), rep.times.decode_ms(64, FIT_CONTEXT)
                slope = max(many - one, 0.0) / 63
                fits[rep] = ((one - slope) * 1e-3, slope * 1e-3)
            return fits[rep]

        def route(req, replicas) -> int:
            loads = [rep.load() for rep in replicas]
            return pick_rank([t for t, _ in loads], [n for _, n in loads], [rep.limits.kv_tokens for rep in replicas],
                             req.input_len, step_fit=[fit(rep) for rep in replicas])

        return route

    def decisions(self, model):
        # the runtime decides the same way from the options' flags (`launch_flags`)
        return {"offload_layers": len(self.offload_layers(model)), "copy_ms_per_forward": round(model.copy_ms(), 3)}


TECHNIQUE = ZeroDPTechnique()
