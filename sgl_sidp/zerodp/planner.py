"""ZeroDP as the planner sees it (`sgl_sidp.plan.technique.Technique`): `zerodp_dp{d}[_tp{t}]`, MoE models, d replicas
of TP t, one source holding every expert and d - 1 sinks pulling their offloaded layers' routed experts each forward
from the source's HBM."""

from __future__ import annotations

from sgl_sidp.plan.configs import Configuration
from sgl_sidp.plan.technique import Technique


class ZeroDPTechnique(Technique):
    name = "zerodp"
    patterns = (r"zerodp_dp(?P<dp>\d+)(?:_tp(?P<tp>\d+))?",)
    form = "zerodp_dpD[_tpT][_all|_pfN|_kvN]"
    options = {"all": "every MoE layer offloaded on the sinks (--zerodp-layers all)",
               "pf": "the policy sized for forwards of N prefill tokens (pfN: --zerodp-expected-batch prefill:N)",
               "kv": "the policy sized for a saturated cache of N-token sequences (kvN: --zerodp-expected-batch kv:N)"}
    valued = frozenset({"pf", "kv"})

    def split_configurations(self, shapes, n_gpus, dp, tp):
        if dp == 1 or not shapes.moe_layers:
            return []
        return [Configuration(f"zerodp_dp{dp}" + (f"_tp{tp}" if tp > 1 else ""), self.name, dp, tp)]

    def launch_flags(self, c, opts, b_th, shift_threshold, expected_batch):
        # its runtime policy picks the offload set with the same cost model
        flags = super().launch_flags(c, opts, b_th, shift_threshold, expected_batch)
        if "all" in opts:
            return flags + ["--overlay-mode", "zerodp", "--zerodp-layers", "all"]
        if "pf" in opts or "kv" in opts:
            expected_batch = f"prefill:{opts['pf']}" if "pf" in opts else f"kv:{opts['kv']}"
        return flags + ["--overlay-mode", "zerodp"] + (["--zerodp-expected-batch", expected_batch]
                                                        if expected_batch else [])

    def weight_bytes_per_gpu(self, c, shapes, elt, sink_offload, slots):
        """The source's (every weight) and a sink's, whose `sink_offload` layers' experts it pulls into `slots`
        slots."""
        full = shapes.weight_bytes(c.tp, c.tp, c.tp, elt)
        slot = elt * shapes.expert_params() // c.tp
        sink = shapes.weight_bytes(c.tp, c.tp, c.tp, elt, expertless=sink_offload)
        return {"source": full, "sink": sink + (slots * slot if sink_offload else 0)}

    def total_kv_tokens(self, c, kv):
        return kv["source"] + (c.dp - 1) * kv["sink"]


TECHNIQUE = ZeroDPTechnique()
