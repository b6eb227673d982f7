"""Shift as the planner sees it (`sgl_sidp.plan.technique.Technique`): `shift_sp{s}_tp{t}`, dense models, one replica
over P = s x t GPUs with one KV cache in the TP-P layout; a forward runs the shift configuration (TP P) at small
sizes, else the base configuration (SP s x TP t, Ulysses' all-to-alls)."""

from __future__ import annotations

import math

from sgl_sidp.calibration.memory import GIB
from sgl_sidp.plan.configs import Configuration, shard_of
from sgl_sidp.plan.technique import Technique

#: GiB a Shift GPU holds before SGLang sizes its KV pool beyond its base weights and a TP group's reserve: measured at
#: SP2 x TP1 with Qwen3-8B (SGLang's pool against the planner's weights: 9,286 tokens fewer on 2 x H100, 9,188 on
#: 2 x H200, of 73,728 bytes a GPU each, 0.63-0.64 GiB; benchmarks/results/multi_gpu/q8_shift_2gpu_h100,
#: plan_multi_gpu/qwen3_8b_2xh200), not attributed further (the SP groups, made with pynccl before the pool, are the
#: likely part). Other SP x TP are not measured apart: taken the same.
RESERVE_GIB = 0.64

#: µs a forward keeps per layer of each copy and barrier of the overlapped exchanges (`ulysses.heads_exchanged`,
#: `tokens_exchanged_gemm`: SP - 1 copies and one barrier each way, hidden but for this). Fitted on 2 and 4 x H200,
#: the servers' start-up GPU timings of the base prefill against NCCL's on the same host less the planner's NCCL
#: all-to-alls (`_nccl_ms`), 2,048-8,192 tokens: Qwen3-8B SP2 0.1-0.45 ms a forward (1-3 µs), Qwen3-32B SP4 2.3-4.4
#: (4.5-8.6 µs), Qwen3-32B SP2 0.35-3.0 across two hosts (1.4-12 µs) (benchmarks/results/multi_gpu/q8_overlap_4gpu_h200,
#: q32_overlap_4gpu_h200, q32_overlap2_4gpu_h200 against q32_burst2_2gpu_h200): 5 µs puts each within 1 % of its
#: forward. Not measured on H100 (taken the same).
OVERLAP_STEP_US = 5.0

#: The same per copy and barrier of a decode forward: its GEMMs are too small to hide the copies. Fitted on Qwen3-8B
#: SP2's 512-row decode steps (about 1,150 tokens of context) in its decode graphs, against DP2's 256-row steps of the
#: same host and run: 23.6 ms a forward against 21.9 profiled (barrier kernels and P2P copies 1.2 ms, the QKV and O
#: GEMMs split for the overlap 0.42 longer, idle 0.6), 23.93 against 21.80 in the servers' logs, 23.9 against 21.9 on
#: another host: 1.7-2.1 ms over DP2's step (the base shard's work), 12-15 µs each of the 144 copies and barriers (2 x
#: H200, benchmarks/results/multi_gpu/q8_decode_prof_pair, q8_graphs512_incr_pair, q8_symm_ar_pair). Not measured at
#: other batches, SP or on H100 (taken the same).
OVERLAP_DECODE_STEP_US = 13.0

#: How much longer the base configuration's prefill forwards take in a busy server than their price (the shard's
#: calibration at the GPU kind's sustained clock, `steps.PREFILL_SUSTAINED_FACTOR`), by GPU kind: it scales the base
#: shard's per-token prefill terms (`Technique.served_prefill_factor`). Fitted on the time between back-to-back full
#: prefill chunks while prompts queued, in the logs of twelve replays of eleven committed runs, against the chunks
#: simulated for them (`bench.cadence`; `benchmarks/results/plan_multi_gpu/shift_served_prefill.md`): Shift's ran
#: 1.8-6.5 % longer than priced (median 3.7 %; H100 3.6-6.5 %, H200 1.8-4.5 %), TP's 0.1-4.2 % shorter. So a Shift
#: replay near its prefill capacity drained its prompts in the simulation and not in the server (Qwen3-8B at 2x on 2 x
#: H100: TPOT p50 46 ms predicted, 91 measured; 86 with every prefill priced 8 % longer). With these factors Shift's
#: chunks come within -1.8 to +1.5 %. Not located: the profiled base forwards of bursts ran as priced
#: (`multi_gpu/README.md`), so the cost is a busy server's, between or inside forwards; and it is Shift's own: DP
#: replicas, whose TP1 forwards have no all-reduce spells either, ran their chunks within -3 to +2 % of the price (not a
#: clock effect; not profiled). H100's factor rests on Qwen3-8B tables of one-request prefills alone (TP2's chunks there
#: priced 2.4-4.1 % long): derive it again with `bench.cadence` once `plan calibrate` on H100 adds prefills of several
#: prompts (gpu_runs.sh cal_q8).
SERVED_BASE_PREFILL = {"H100": 1.05, "H200": 1.03}


class ShiftTechnique(Technique):
    name = "shift"
    patterns = (r"shift_sp(?P<sp>\d+)_tp(?P<tp>\d+)",)
    form = "shift_spS_tpT[_thN][_exact][_nccl|_overlap]"
    options = {"th": "the threshold in tokens per forward (thN: --shift-threshold N; th1 puts every forward of two "
                     "tokens or more in the base configuration)",
               "exact": "the base configuration rounds as TP does (--shift-exact)",
               "nccl": "the base configuration's exchanges by NCCL's all-to-alls (--shift-all-to-all nccl)",
               "overlap": "the base configuration's exchanges by copies behind its GEMMs, the default (--shift-all-to-all "
                          "overlap)"}
    valued = frozenset({"th"})
    modeled_options = frozenset({"th", "nccl", "overlap"})  # exact: its base forward's cost is not modeled
    host_role = "shift"

    def decode_graph_max_bs(self, c, sglang_default):
        """At least `feature.DECODE_GRAPH_MAX_BS` (Shift's SGLang default)."""
        from sgl_sidp.shift.feature import DECODE_GRAPH_MAX_BS

        return max(sglang_default, DECODE_GRAPH_MAX_BS)

    def node_configurations(self, shapes, n_gpus):
        if n_gpus == 1 or shapes.moe_layers:
            return []
        return [Configuration(f"shift_sp{sp}_tp{n_gpus // sp}", self.name, 1, n_gpus // sp, sp)
                for sp in range(2, n_gpus + 1) if n_gpus % sp == 0]

    def check_name(self, name, groups, options):
        if "nccl" in options and "overlap" in options:
            raise ValueError(f"configuration {name}: nccl and overlap are two ways of one exchange; name one")

    def wiring_check(self, c):
        """SP = 1: the base configuration is TP = P on the overlay's own hooks and GEMMs, nothing shifts."""
        return c.sp == 1

    def launchable_unplanned(self, c, shapes):
        """SP = 1 on a dense model (`wiring_check`)."""
        return self.wiring_check(c) and not shapes.moe_layers

    def launched_name(self, dp, tp_size, settings):
        sp = settings.sp or tp_size  # 0 is resolved at launch (`shift.feature.resolve`); unresolved, SP = P
        return f"shift_sp{sp}_tp{tp_size // sp}" if dp == 1 else None

    def served_prefill_factor(self, c, role, gpu):
        """`SERVED_BASE_PREFILL` for the base shard (its forwards above the threshold), 1.0 for the shift shard."""
        return SERVED_BASE_PREFILL.get(gpu, 1.0) if role == "base" and c.sp > 1 else 1.0

    def attn_tp(self, c):
        """SP x TP: its one cache in the TP = P layout."""
        return c.tp * c.sp

    def shard_attn_tp(self, c, role):
        """TP_b for the base shard, which is timed with TP_b's heads; SP x TP for the shift shard."""
        return c.tp if role == "base" else c.attn_tp

    def launch_flags(self, c, opts, b_th, shift_threshold):
        flags = ["--tp-size", str(c.sp * c.tp), "--overlay-mode", "shift", "--shift-sp", str(c.sp)]
        th = opts.get("th", shift_threshold)
        flags += ["--shift-threshold", str(int(th))] if th not in (None, float("inf")) and th > 0 else []
        exchange = ["--shift-all-to-all", o] if (o := next((o for o in ("nccl", "overlap") if o in opts), None)) else []
        return flags + (["--shift-exact"] if "exact" in opts else []) + exchange

    def shards(self, c, shapes):
        """"shift" (TP = P) and "base": the TP_b model on 1/SP of the tokens (`Configuration.shards`)."""
        p = c.sp * c.tp
        return {"shift": shard_of(shapes, p, p, p), "base": shard_of(shapes, c.tp, c.tp, p, 1 / c.sp)}

    def weight_bytes_per_gpu(self, c, shapes, elt, sink_offload, slots, chunk):
        """The base configuration's weights (the shift configuration's are views of them), `RESERVE_GIB` and, with the
        overlapped exchanges, their receive buffer: two slots of a `chunk`-token prefill's QKV blocks (`ShiftRuntime.
        make_exchange`, sized by `--chunked-prefill-size`; 101 MB on Qwen3-8B at SP2 and 8,192 tokens, measured as
        1,394 KV tokens fewer than NCCL's server beside it)."""
        p = c.sp * c.tp
        exchange = 0 if self.by_nccl(c) else 2 * (-(-chunk // c.sp) * c.sp) * shapes.qkv_width(p) * elt
        return {"gpu": shapes.weight_bytes(attn_tp=c.tp, mlp_tp=c.tp, vocab_tp=p, elt=elt) + int(RESERVE_GIB * GIB)
                + exchange}

    @staticmethod
    def by_nccl(c) -> bool:
        """Whether the base configuration exchanges by NCCL's all-to-alls (`_nccl`, `--shift-exact`, or SP = 1: no
        exchange) rather than the default overlapped copies."""
        return "nccl" in c.options or "exact" in c.options or c.sp == 1

    # ------------------------------------------------------------------ step times
    # A forward of b tokens runs the shift configuration (the TP-P shard + its all-reduces) when b <= the threshold,
    # else the base configuration: the TP_b shard on b / SP tokens (decode attention is the same work: b / SP
    # sequences x H / TP_b heads = b x H / P), a prefill's attention 1/SP of the TP_b shard's (heads / P over the whole
    # sequence), 2 all-to-alls per layer over SP (QKV in, attention out) and the TP_b all-reduces of b / SP tokens.
    # The threshold is `cost.shift_threshold` of the two, as Shift's runtime picks it.
    @property
    def model_attributes(self):
        return {"shift_threshold": self.threshold}

    def _ulysses_ms(self, model, tokens: float, prefill: bool) -> float:
        """What Ulysses' two exchanges per layer over SP add to a forward of `tokens` (ms): by default
        (`--shift-all-to-all overlap`) the copies hidden behind the GEMMs leave `OVERLAP_STEP_US` (in a decode forward
        `OVERLAP_DECODE_STEP_US`) per copy and barrier per layer (2 SP of them: SP - 1 copies and one barrier each
        way); by NCCL (`_nccl`, `--shift-exact`) `_nccl_ms`."""
        c = model.config
        if self.by_nccl(c):
            return self._nccl_ms(model, tokens) if c.sp > 1 else 0.0
        return model.shapes.layers * 2 * c.sp * (OVERLAP_STEP_US if prefill else OVERLAP_DECODE_STEP_US) / 1e3

    def _nccl_ms(self, model, tokens: float) -> float:
        """Ulysses' two all-to-alls per layer over SP in a forward of `tokens` (ms): QKV in, the attention output back.

        Each SP rank's buffer (what `measure-comm` times per rank) holds its `tokens` / SP tokens with the SP blocks
        of a shift shard's columns (`shift.ulysses.heads_all_to_all`), i.e. `tokens` x one shift shard's QKV width
        (`ModelShapes.qkv_width` at P = SP x TP, KV heads replicated as SGLang replicates them), and on the way back
        `tokens` x its heads' output width: the buffers `bench.a2a` times (`bench.a2a.block_widths`). Qwen3-32B's SP4
        forward of 8,192 tokens: 14.3 ms predicted, 15.5 ms measured by `bench.a2a` on 4 x H100 (the base shard's
        width, SP times these bytes, gave 50.6 ms: benchmarks/results/plan_multi_gpu/shift_all_to_all.md)."""
        s, c = model.shapes, model.config
        p = c.sp * c.tp
        return (model._collective_ms("all_to_all", c.sp, tokens, 1, s.qkv_width(p))
                + model._collective_ms("all_to_all", c.sp, tokens, 1, s.heads // p * s.head_dim))

    def _shift_terms(self, model, size: float, base: bool, prefill: bool) -> tuple:
        """`terms` of the shift configuration (the TP-P shard and its all-reduces), or with `base` of the base
        configuration: the TP_b shard on `size` / SP, the TP_b all-reduces of `size` / SP and Ulysses' all-to-alls
        (`prefill`: of a prefill forward, else of a decode one)."""
        c = model.config
        if base:
            return (model.clocks["base"], c.sp, model._collective_ms("all_reduce", c.tp, size / c.sp),
                    self._ulysses_ms(model, size, prefill), 0.0, -math.inf)
        return model.clocks["shift"], 1, model._collective_ms("all_reduce", c.sp * c.tp, size), 0.0, 0.0, -math.inf

    def threshold(self, model) -> float:
        """Tokens per forward above which Shift runs its base configuration (`cost.shift_threshold` over decode
        batches and one-request prefills, both configurations predicted). A configuration named with `_thN` runs at
        threshold N, as its launch flags say (`bench.validate` names a measured server's own threshold so)."""
        given = model.config.option_values.get("th")
        return model.decided("shift_threshold", lambda: float(given) if given is not None else self._threshold(model))

    def _threshold(self, model) -> float:
        from sgl_sidp.calibration.cost import shift_threshold

        points = {}
        for b in (1, 8, 32, 64, 128, 256):
            points[b] = tuple(model._decode_with(self._shift_terms(model, b, base, False), b, 1024)
                              for base in (False, True))
        for t in (512, 1024, 2048, 4096, 8192):
            points[t] = tuple(model._prefill_with(self._shift_terms(model, t, base, True), [(t, 0)])
                              for base in (False, True))
        return shift_threshold(points)

    def terms(self, model, size, role, variant, prefill=False):
        return self._shift_terms(model, size, size > self.threshold(model), prefill)

    def steps_variant(self, model):
        """"nccl" where the base configuration exchanges by NCCL (`_ulysses_ms`), else "overlap": the two step
        apart at the same threshold."""
        return "nccl" if self.by_nccl(model.config) else "overlap"

    def decisions(self, model):
        return {"shift_threshold": self.threshold(model)}


TECHNIQUE = ShiftTechnique()
