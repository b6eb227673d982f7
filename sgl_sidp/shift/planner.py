"""Shift as the planner sees it (`sgl_sidp.plan.technique.Technique`): `shift_sp{s}_tp{t}`, dense models, one replica
over P = s x t GPUs with one KV cache in the TP-P layout; a forward runs the shift configuration (TP P) at small
sizes, else the base configuration (SP s x TP t, Ulysses' all-to-alls)."""

from __future__ import annotations

from sgl_sidp.plan.configs import Configuration, shard_of
from sgl_sidp.plan.technique import Technique


class ShiftTechnique(Technique):
    name = "shift"
    patterns = (r"shift_sp(?P<sp>\d+)_tp(?P<tp>\d+)",)
    form = "shift_spS_tpT[_thN][_exact]"
    options = {"th": "the threshold in tokens per forward (thN: --shift-threshold N; th1 puts every forward of two "
                     "tokens or more in the base configuration)",
               "exact": "the base configuration rounds as TP does (--shift-exact)"}
    valued = frozenset({"th"})
    host_role = "shift"

    def node_configurations(self, shapes, n_gpus):
        if n_gpus == 1 or shapes.moe_layers:
            return []
        return [Configuration(f"shift_sp{sp}_tp{n_gpus // sp}", self.name, 1, n_gpus // sp, sp)
                for sp in range(2, n_gpus + 1) if n_gpus % sp == 0]

    def attn_tp(self, c):
        """SP x TP: its one cache in the TP = P layout."""
        return c.tp * c.sp

    def launch_flags(self, c, opts, b_th, shift_threshold, expected_batch):
        flags = ["--tp-size", str(c.sp * c.tp), "--overlay-mode", "shift", "--shift-sp", str(c.sp)]
        th = opts.get("th", shift_threshold)
        flags += ["--shift-threshold", str(int(th))] if th not in (None, float("inf")) and th > 0 else []
        return flags + (["--shift-exact"] if "exact" in opts else [])

    def shards(self, c, shapes):
        """"shift" (TP = P) and "base": the TP_b model on 1/SP of the tokens (`Configuration.shards`)."""
        p = c.sp * c.tp
        return {"shift": shard_of(shapes, p, p, p), "base": shard_of(shapes, c.tp, c.tp, p, 1 / c.sp)}

    def weight_bytes_per_gpu(self, c, shapes, elt, sink_offload, slots):
        p = c.sp * c.tp
        return {"gpu": shapes.weight_bytes(attn_tp=c.tp, mlp_tp=c.tp, vocab_tp=p, elt=elt)}


TECHNIQUE = ShiftTechnique()
