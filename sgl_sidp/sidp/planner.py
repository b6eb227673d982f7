"""SiDP as the planner sees it (`sgl_sidp.plan.technique.Technique`): `sidp_dp{d}[_tp{t}]_{was,cas,auto}`, dense
models, d ranks of TP t, each holding its own 1/d of the FFN layers. WaS streams the others' FFN weights every
forward; CaS sends each layer's rows to its owner; auto runs WaS at batches from B_th on, CaS below."""

from __future__ import annotations

from sgl_sidp.plan.configs import Configuration
from sgl_sidp.plan.technique import Technique, option


class SiDPTechnique(Technique):
    name = "sidp"
    patterns = (r"sidp_dp(?P<dp>\d+)(?:_tp(?P<tp>\d+))?_(?P<variant>was|cas|auto)",)
    form = "sidp_dpD[_tpT]_{was,cas,auto}[_graphs|_eager][_bthN]"
    options = {"graphs": "CaS decodes in CUDA graphs, asked for (--sidp-cas-graphs; the default where they can run)",
               "eager": "CaS decodes without CUDA graphs (--no-sidp-cas-graphs)",
               "bth": "auto's B_th in tokens per rank (bthN: --sidp-b-th N)"}
    valued = frozenset({"bth"})

    def split_configurations(self, shapes, n_gpus, dp, tp):
        if dp == 1:
            return []
        return [None if shapes.moe_layers or shapes.layers < dp else
                Configuration(f"sidp_dp{dp}" + (f"_tp{tp}" if tp > 1 else "") + f"_{variant}", self.name, dp, tp,
                              variant=variant)
                for variant in ("was", "cas", "auto")]

    def check_name(self, name, groups, options):
        if any(option(o)[0] == "bth" for o in options) and groups["variant"] != "auto":
            raise ValueError(f"configuration {name}: B_th (bthN) is auto's; {groups['variant']} has none")

    def launch_flags(self, c, opts, b_th, shift_threshold, expected_batch):
        flags = super().launch_flags(c, opts, b_th, shift_threshold, expected_batch)
        flags += ["--overlay-mode", "sidp", "--sidp-service", c.variant]
        b_th = opts.get("bth", b_th)
        if c.variant == "auto" and b_th not in (None, float("inf")):
            flags += ["--sidp-b-th", str(int(b_th))]
        if "graphs" in opts:
            flags += ["--sidp-cas-graphs"]
        if "eager" in opts:
            flags += ["--no-sidp-cas-graphs"]
        return flags

    def weight_bytes_per_gpu(self, c, shapes, elt, sink_offload, slots):
        """A rank owning its share of the FFN layers, with `slots` slots for the others'."""
        owned = tuple(i for i in range(shapes.layers) if i % c.dp == 0)  # rank 0's share; every rank alike
        layer = elt * shapes.dense_mlp_params() // c.tp
        return {"gpu": shapes.weight_bytes(c.tp, c.tp, c.tp, elt, mlp_layers=owned) + slots * layer}


TECHNIQUE = SiDPTechnique()
