"""SiDP as the planner sees it (`sgl_sidp.plan.technique.Technique`): `sidp_dp{d}[_tp{t}]_{was,cas,auto}`, dense
models, d ranks of TP t, each holding its own 1/d of the FFN layers. WaS streams the others' FFN weights every
forward; CaS sends each layer's rows to its owner; auto runs WaS at batches from B_th on, CaS below."""

from __future__ import annotations

import math

from sgl_sidp.calibration.memory import GIB
from sgl_sidp.plan.configs import Configuration
from sgl_sidp.plan.technique import Technique, option
from sgl_sidp.sidp.settings import ring_slots


#: GiB a SiDP rank holds before SGLang sizes its KV pool beyond its weights and WaS slots, by DP size: measured on
#: H100 (SGLang's KV pool against the planner's weights: Qwen3-32B DP2 106,798 tokens a rank, Llama-3.1-70B DP4
#: 27,775; benchmarks/results/multi_gpu/q32_sidp512_2gpu_h100, l70_sidp512_4gpu_h100), not attributed further (the
#: ranks' NCCL group for CaS and the lockstep is created before the pool). Larger DP sizes take the DP4 figure.
#: Before a915a46 (placeholders carved out of freed blocks) it was 0.32 and 0.51 GiB.
RANK_RESERVE_GIB = {2: 0.03, 4: 0.08}


class SiDPTechnique(Technique):
    name = "sidp"
    patterns = (r"sidp_dp(?P<dp>\d+)(?:_tp(?P<tp>\d+))?_(?P<variant>was|cas|auto)",)
    form = "sidp_dpD[_tpT]_{was,cas,auto}[_graphs|_eager][_bthN|_measured]"
    options = {"graphs": "CaS decodes in CUDA graphs, asked for (--sidp-cas-graphs; the default where they can run)",
               "eager": "CaS decodes without CUDA graphs (--no-sidp-cas-graphs)",
               "bth": "auto's B_th in tokens per rank (bthN: --sidp-b-th N)",
               "measured": "auto's B_th measured by the ranks at start-up (--sidp-b-th-measure)"}
    valued = frozenset({"bth"})
    modeled_options = frozenset({"bth", "graphs"})  # graphs: the step model's CaS decodes are already in graphs

    def split_configurations(self, shapes, n_gpus, dp, tp):
        if dp == 1:
            return []
        return [None if shapes.moe_layers or shapes.layers < dp else
                Configuration(self.replica_name(dp, tp, variant), self.name, dp, tp, variant=variant)
                for variant in ("was", "cas", "auto")]

    def launched_name(self, dp, tp_size, settings):
        return self.replica_name(dp, tp_size, settings.service)

    def check_name(self, name, groups, options):
        given = {option(o)[0] for o in options} & {"bth", "measured"}
        if given and groups["variant"] != "auto":
            raise ValueError(f"configuration {name}: B_th (bthN, measured) is auto's; {groups['variant']} has none")
        if len(given) == 2:
            raise ValueError(f"configuration {name}: bthN and measured both set B_th: name one")

    def launch_flags(self, c, opts, b_th, shift_threshold):
        flags = super().launch_flags(c, opts, b_th, shift_threshold)
        flags += ["--overlay-mode", "sidp", "--sidp-service", c.variant]
        # the planner's B_th (`b_th`) is not passed on: the ranks measure it at start-up (`--sidp-b-th-measure`'s
        # default), and where they cannot, the launcher asks the planner for the same number (`sidp.feature.resolve`)
        if "measured" in opts:
            flags += ["--sidp-b-th-measure"]
        elif "bth" in opts:
            flags += ["--sidp-b-th", str(opts["bth"])]
        if "graphs" in opts:
            flags += ["--sidp-cas-graphs"]
        if "eager" in opts:
            flags += ["--no-sidp-cas-graphs"]
        return flags

    def memory(self, c, model, shapes, free_before_load, mem_fraction_static, elt):
        """The WaS ring's slots at the default `--sidp-slots` (`settings.ring_slots`: 3 at DP4, 2 at DP2)."""
        return {"slots": ring_slots(0, c.dp)}

    def weight_bytes_per_gpu(self, c, shapes, elt, sink_offload, slots, chunk):
        """A rank owning its share of the FFN layers, with `slots` slots for the others', and its reserve
        (`RANK_RESERVE_GIB`)."""
        owned = tuple(i for i in range(shapes.layers) if i % c.dp == 0)  # rank 0's share; every rank alike
        layer = elt * shapes.dense_mlp_params() // c.tp
        reserve = RANK_RESERVE_GIB.get(c.dp, RANK_RESERVE_GIB[4]) * GIB
        return {"gpu": shapes.weight_bytes(c.tp, c.tp, c.tp, elt, mlp_layers=owned) + slots * layer + int(reserve)}

    # ------------------------------------------------------------------ step times
    # WaS streams the other (d-1)/d of the FFN weights every forward (as a ZeroDP sink, each rank's egress serving the
    # others); CaS sends each layer's rows to its owner, which runs that layer's FFN on every rank's rows (the FFN's
    # share of d x b tokens' linear time, plus an all-gather and a reduce-scatter of d x b x h x e bytes per layer);
    # auto runs WaS at b >= B_th and CaS below.
    @property
    def model_attributes(self):
        return {"b_th": self.b_th}

    def b_th(self, model) -> float:
        """Auto's B_th (tokens per rank): the smallest batch from which WaS is predicted no slower than CaS
        (`cost.first_lasting_win` over decode batches 1-1,024 at `model.context`); inf when CaS wins throughout.
        SiDP's launcher gives auto this B_th where `--sidp-b-th` does not and the ranks cannot measure it at start-up
        (`sidp.feature.resolve`).
        A configuration named with `_bthN` runs auto at B_th = N, as its launch flags say."""
        given = model.config.option_values.get("bth")
        return model.decided("b_th", lambda: float(given) if given is not None else self._b_th(model))

    @staticmethod
    def _b_th(model) -> float:
        from sgl_sidp.calibration.cost import first_lasting_win

        sizes = [1, 2, 4] + list(range(8, 1025, 8))
        b = first_lasting_win(lambda x: model._decode_with(model._terms(x, variant="was"), x, model.context),
                              lambda x: model._decode_with(model._terms(x, variant="cas"), x, model.context), sizes)
        return float("inf") if b is None else float(b)

    def terms(self, model, size, role, variant, prefill=False):
        c = model.config
        all_reduce = model._collective_ms("all_reduce", c.tp, size)
        variant = variant or c.variant
        if variant == "was" or (variant == "auto" and size >= self.b_th(model)):
            return (model.clock, 1, all_reduce, *model._stream_terms(prefill))
        return (model.clock, 1, all_reduce, *model._gathered_terms(size, c.dp), -math.inf)

    def lockstep(self, c):
        """CaS and auto: one all-gather of every rank's token counts per iteration (`control.lockstep.Lockstep`)."""
        return c.variant != "was"

    def streamed_bytes(self, model):
        """A WaS rank's non-owned FFNs."""
        s, c = model.shapes, model.config
        return (s.layers - len(range(0, s.layers, c.dp))) * model.elt * s.dense_mlp_params() // c.tp

    def steps_variant(self, model):
        """Auto with its B_th at most one token steps as WaS at every batch and prefill, with B_th inf as CaS."""
        c = model.config
        if c.variant == "auto":
            b_th = self.b_th(model)
            return "was" if b_th <= 1 else "cas" if b_th == float("inf") else "auto"
        return c.variant

    def decisions(self, model):
        return {"b_th": self.b_th(model), "copy_ms_per_forward": round(model.copy_ms(), 3)}


TECHNIQUE = SiDPTechnique()
