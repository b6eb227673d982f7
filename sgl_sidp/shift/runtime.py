"""Shift Parallelism in one SGLang TP process: the base configuration (Ulysses SP) on SGLang's TP = P model.

Source: Hidayetoglu et al., "Shift Parallelism" (Snowflake; ArcticInference). SGLang runs the model at
`--tp-size P` as it always does: that is the **shift** configuration, untouched (its weights become views, below).
The **base** configuration (SP, TP_b = P / SP) runs inside the same forward code, chosen per forward by the
forward's token count (`ShiftRuntime.base_for`), through these hooks (each listed in `sgl_sidp.hooks.HOOKS`):

- AFTER `ModelRunner.init_torch_distributed`: the SP groups {t * SP + s : s} and, when TP_b > 1, the TP_b groups
  {t * SP + s : t}, as SGLang `GroupCoordinator`s (pynccl, kept enabled so their collectives are captured in CUDA
  graphs outside SGLang's `graph_capture`, as SGLang does for its PD-multiplexing groups). GPU g = TP rank g is SP
  rank g % SP: the shift group is SGLang's TP group in its own order, so the head order `tp * SP + sp` of
  `heads.shift_rank` holds with no permutation. With `--shift-all-to-all overlap` also the SP group's
  `sgl_sidp.peer.exchange.SymmetricExchange` (its receive buffer allocated here, before the weights).
- AFTER `ModelRunner.load_model`: per decoder layer, the base weights of `qkv_proj`, `o_proj`, `gate_up_proj` and
  `down_proj` gathered over the SP group from the TP = P shards, one tensor at a time (`views.rebase`); each
  shard parameter then points into its base weight, so the shift configuration adds nothing, and the old shard's
  memory goes back to the GPU. SGLang sizes the KV cache afterwards, from what is left.
- AROUND `VocabParallelEmbedding.forward` (the model's `embed_tokens`), the first op of every forward, eager or being
  captured: decide base or shift from the token count, then in base keep this SP rank's slice of the embedded tokens
  (`ulysses.local_tokens`; SGLang's TP = P lookup and all-reduce run for all tokens).
- base only, AROUND `QKVParallelLinear.forward` (qkv_proj): the base QKV GEMM, one per shift shard into the
  all-to-all's send layout (`ulysses.column_blocks`), and one all-to-all (`ulysses.heads_all_to_all`); with
  `--shift-all-to-all overlap` the peers' blocks first, each copied into its owner's memory while the next GEMM runs
  (`ulysses.heads_exchanged`). SGLang's q/k norm, RoPE, `RadixAttention` and KV-cache writes then run on the whole
  batch for this GPU's heads, exactly as in the shift configuration.
- base only, AROUND `RowParallelLinear.forward` (o_proj): one all-to-all back (`ulysses.tokens_all_to_all`) and the
  base O GEMM, one per received block (`ulysses.row_blocks_gemm`); with overlap the peers' tokens are copied out
  while this GPU multiplies its own heads' block (`ulysses.tokens_exchanged_gemm`) (Llama, whose o_proj reduces
  itself: then over the TP_b group).
- base only, AROUND `communication_op.attention_tensor_model_parallel_all_reduce` (SGLang's post-attention TP
  all-reduce in `LayerCommunicator.prepare_mlp`): over the TP_b group, or nothing when TP_b = 1 (the SP ranks hold
  different tokens: an all-reduce over all P GPUs would mix them).
- base only, AROUND `Qwen2MLP.forward` / `LlamaMLP.forward`: base gate|up GEMM, SGLang's `act_fn` per shard (`ulysses.act_per_shard`),
  base down GEMM, TP_b all-reduce.
- base only, AROUND `LogitsProcessor.forward`: the last hidden states of every SP rank gathered in token order
  (`ulysses.gather_tokens`) before SGLang prunes them and computes the vocab-sharded logits.

CUDA graphs: a graph is base or shift by its captured size (the decision above runs at capture).
- Decode: SGLang's graph runner captures `model.forward` per batch size, logits included.
- Prefill (SGLang 0.5.17's default breakable graphs, one per token bucket up to the chunked-prefill size): the
  decoder layers are captured in segments, attention runs eagerly between them on the live batch's metadata (the
  same in both configurations), and the logits tail runs eagerly after the replay. AROUND
  `PrefillCudaGraphRunner._execute_body_capture` (the replay) sets the configuration of the replayed bucket, so the
  eager logits hook gathers the base configuration's tokens. The `full` and `tc_piecewise` prefill backends are
  refused (`shift.feature.check`): one slices the body's rows, the other traces the hooks with torch.compile.

The threshold (`--shift-threshold`, 0 = calibrate): every TP rank times the same prefills of
`CALIBRATION_TOKENS` in both configurations; TP rank 0 picks the threshold (`calibration.cost.shift_threshold`) and
hands it to the others; it is cached on disk (`CalibrationCache.put_extra`, keyed like every start-up calibration
plus the SP), so the next start reads it before anything is captured. Where:
- with prefill graphs, AROUND `PrefillCudaGraphRunner.capture`, before the first graph exists, on SGLang's dummy
  prefill bodies (`calibration.measure.time_dummy_prefill`): every graph, prefill and decode, is captured with it.
  No graph exists yet, so each body runs eagerly with its kernels queued behind a GPU sleep, as long on every TP
  rank, and the TP ranks aligned by a barrier first (`measure.queued_gpu_ms`): the GPU's time, as the graphs later
  replay it. Timed from the host, launches hid it below about 2,048 tokens and the threshold always landed there;
- without (`--disable-prefill-cuda-graph`), AFTER `Scheduler.__init__`, on one-request prefills through the
  scheduler's pools (`calibration.measure.time_prefill`, logits included): the decode graphs of that first start
  stay in the shift configuration (threshold provisionally infinite); eager forwards follow the threshold at once.
"""

from __future__ import annotations

import bisect
import logging
import math
from typing import Callable

import torch
import torch.nn.functional as F

from sgl_sidp.process import Progress
from sgl_sidp.shift import ulysses
from sgl_sidp.shift.views import COLUMN, ROW, rebase

logger = logging.getLogger(__name__)

#: Prefill sizes (tokens, one request) timed in both configurations to pick the threshold.
CALIBRATION_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192)

#: per decoder layer: (module path inside the layer, stacking dimension of its shards, role)
LINEARS = (("self_attn.qkv_proj", COLUMN, "qkv"), ("self_attn.o_proj", ROW, "o"),
           ("mlp.gate_up_proj", COLUMN, "gate_up"), ("mlp.down_proj", ROW, "down"))


class ShiftError(RuntimeError):
    """The model cannot run the base configuration (an unknown layer, quantized weights, a row-parallel bias)."""


def sub_module(root: torch.nn.Module, path: str) -> torch.nn.Module:
    for name in path.split("."):
        root = getattr(root, name)
    return root


def _tp_rank() -> int:
    """This GPU's TP rank, from SGLang's TP group (built before `on_init_torch_distributed`, the first hook asking)."""
    from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


class ShiftRuntime:
    """Shift Parallelism's state in one TP process, and its hook bodies (see the module doc).

    Args:
        ctx: the plugin's per-process context (`sgl_sidp.plugin.PluginContext`); reads `ctx.config.shift`.

    Attributes:
        p, sp, tp_b: GPUs, the base configuration's SP and TP; sp_rank, tb_rank: this GPU's place in it.
        sp_comm, tb_comm: the SP and TP_b groups (`all_to_all_single`, `all_gather_into_tensor`, `all_reduce`);
            tb_comm is None when TP_b = 1.
        base: True while the current forward runs the base configuration; n_tokens: its tokens.
        forwards, tokens: per configuration ("base", "shift"), forwards and tokens the scheduler ran (from the
            batch signal); switches: changes of configuration between consecutive forwards.
    """

    def __init__(self, ctx):
        self.settings = ctx.config.shift
        self.p = self.sp = self.tp_b = 1
        self.sp_rank = self.tb_rank = 0
        self.sp_comm = self.tb_comm = None
        self.exchange = None  # `--shift-all-to-all overlap`: the SP group's SymmetricExchange
        self.too_large = 0  # base forwards whose blocks exceeded the exchange's buffer (served by NCCL)
        self.threshold: float = self.settings.threshold or math.inf  # inf: provisional, until calibrated
        self.threshold_source = "--shift-threshold" if self.settings.threshold else "provisional (all shift)"
        self.force: str | None = None  # "base" or "shift" while calibrating
        self.graph_base: set[int] = set()  # decode CUDA graph sizes captured in the base configuration
        self.embed_id: int | None = None
        self.roles: dict[int, str] = {}  # id(module) -> "qkv" | "o" | "mlp" | "logits"
        self.weights: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}  # id(linear) -> (base weight, bias)
        self.base = False
        self.n_tokens = 0
        self.forwards = {"base": 0, "shift": 0}
        self.tokens = {"base": 0, "shift": 0}
        self.switches = 0
        self._last: str | None = None
        self.metrics: ShiftMetrics | None = None
        self.capture_bs: list[int] = []  # the decode CUDA graphs' batch sizes, sorted
        self.prefill_bs: list[int] = []  # the prefill CUDA graphs' token buckets, sorted (none when disabled)
        ctx.listeners.append(self._on_iteration)

    # ------------------------------------------------------------------ decisions (CPU-testable)
    def base_for(self, n_tokens: int) -> bool:
        """Whether a forward of `n_tokens` runs the base configuration: above the threshold (and at least SP
        tokens), or as forced while calibrating; the same on every GPU, since every TP rank runs the same batch."""
        if self.force is not None:
            return self.force == "base"
        return n_tokens > self.threshold and n_tokens >= self.sp

    def configure(self, p: int, sp: int, tp_rank: int, sp_comm, tb_comm=None) -> None:
        """Set the layout: P GPUs, base SP; GPU `tp_rank` is SP rank tp_rank % SP of TP_b rank tp_rank // SP."""
        self.p, self.sp, self.tp_b = p, sp, p // sp
        self.sp_rank, self.tb_rank = tp_rank % sp, tp_rank // sp
        self.sp_comm, self.tb_comm = sp_comm, tb_comm

    def adopt(self, model: torch.nn.Module) -> float:
        """Gather the base weights of every decoder layer of `model` and point its TP shards into them; register the
        modules the hooks act on. Returns the GB the base weights added on this GPU.

        Raises:
            ShiftError: a decoder layer without the four linears, a quantized linear, or a row-parallel bias.
        """
        from sgl_sidp.prefetch.binding import decoder_layers

        added = 0
        for i, layer in decoder_layers(model):
            for path, dim, role in LINEARS:
                try:
                    lin = sub_module(layer, path)
                except AttributeError:
                    raise ShiftError(f"--overlay-mode shift: decoder layer {i} ({type(layer).__name__}) has no {path}") from None
                method = type(getattr(lin, "quant_method", None)).__name__
                if method not in ("UnquantizedLinearMethod", "NoneType"):
                    raise ShiftError(f"--overlay-mode shift: layer {i} {path} is quantized ({method}); bf16/fp16 only")
                bias = getattr(lin, "bias", None)
                if dim == ROW and bias is not None:
                    raise ShiftError(f"--overlay-mode shift: layer {i} {path} has a bias (row-parallel biases not supported)")
                base_w = rebase(lin.weight, dim, self.sp, self.sp_rank, self.sp_comm)
                base_b = None if bias is None else rebase(bias, COLUMN, self.sp, self.sp_rank, self.sp_comm)
                self.weights[id(lin)] = (base_w, base_b)
                added += (base_w.numel() - lin.weight.numel()) * base_w.element_size()
                if role in ("qkv", "o"):
                    self.roles[id(lin)] = role
            mlp = layer.mlp
            self.roles[id(mlp)] = "mlp"
        decoder = getattr(model, "model", model)
        self.embed_id = id(decoder.embed_tokens)
        logits = getattr(model, "logits_processor", None)
        if logits is not None:
            self.roles[id(logits)] = "logits"
        return added / 1e9

    def config_of(self, sig) -> tuple[str, int]:
        """(configuration, tokens) of the forward an iteration runs: a batch within the CUDA graphs' sizes runs the
        configuration its graph was captured in, with the graph's size (a decode batch by its batch size, a prefill
        by its tokens; SGLang may still run such a prefill eagerly, e.g. one asking for input logprobs, counted
        here as its bucket); any other forward its token count's."""
        n = int(sig.computed_tokens)
        if n and sig.forward_mode == "DECODE" and self.capture_bs and n <= self.capture_bs[-1]:
            n = self.capture_bs[bisect.bisect_left(self.capture_bs, n)]
            return ("base" if n in self.graph_base else "shift"), n
        if n and sig.forward_mode != "DECODE" and self.prefill_bs and n <= self.prefill_bs[-1]:
            n = self.prefill_bs[bisect.bisect_left(self.prefill_bs, n)]
        return ("base" if self.base_for(n) else "shift"), n

    def _on_iteration(self, sig) -> None:
        """Batch-signal listener: count the forward by the configuration it ran."""
        mode, n = self.config_of(sig)
        if not n:
            return
        switched = self._last is not None and mode != self._last
        self.forwards[mode] += 1
        self.tokens[mode] += n
        self.switches += switched
        self._last = mode
        if self.metrics is not None:
            self.metrics.on_forward(mode, n, switched)

    # ------------------------------------------------------------------ SGLang set-up hooks
    def on_init_torch_distributed(self, result, runner, *args, **kwargs):
        """AFTER `ModelRunner.init_torch_distributed`: the SP (and TP_b) groups, on every TP rank of the world."""
        if getattr(runner, "is_draft_worker", False):
            return result
        from sglang.srt.distributed.parallel_state import (
            get_tensor_model_parallel_world_size,
            get_world_group,
            init_model_parallel_group,
        )

        from sgl_sidp.shift.feature import fused_all_reduce_problems, sp_of

        fused = fused_all_reduce_problems(runner.server_args)  # the launcher refuses it; a vanilla launch may not
        if fused:
            raise ShiftError(fused[0])
        p, tp_rank = get_tensor_model_parallel_world_size(), _tp_rank()
        sp = sp_of(self.settings, p)
        local = get_world_group().local_rank
        backend = torch.distributed.get_backend()

        def groups(lists, name):
            g = init_model_parallel_group(lists, local, backend, use_custom_allreduce=False, group_name=name)
            if g.pynccl_comm is not None:
                g.pynccl_comm.disabled = False  # captured in graphs and used eagerly alike
            return g

        sp_comm = groups([[t * sp + s for s in range(sp)] for t in range(p // sp)], "sidp_shift_sp")
        tb_comm = groups([[t * sp + s for t in range(p // sp)] for s in range(sp)], "sidp_shift_tpb") if sp < p else None
        self.configure(p, sp, tp_rank, sp_comm, tb_comm)
        if self.settings.all_to_all == "overlap" and sp > 1 and not self.settings.exact:
            self.exchange = self.make_exchange(runner, sp_comm, p, sp)
        return result

    @property
    def cache_name(self) -> str:
        """The threshold's name in the calibration cache: by SP, and by exchange where it is not NCCL's (the base
        configuration's cost differs)."""
        return f"shift-sp{self.sp}" + ("-overlap" if self.exchange is not None else "")

    def make_exchange(self, runner, sp_comm, p: int, sp: int):
        """`--shift-all-to-all overlap`: the SP group's `peer.exchange.SymmetricExchange`, sized for the QKV blocks
        of a chunked prefill (SGLang's `--chunked-prefill-size`, else `--max-prefill-tokens`).

        Raises:
            ShiftError: symmetric memory cannot be set up over the SP group's GPUs.
        """
        from sgl_sidp.calibration.memory import ModelShapes
        from sgl_sidp.peer.exchange import ExchangeError, SymmetricExchange

        sa = runner.server_args
        tokens = int(sa.chunked_prefill_size) if (sa.chunked_prefill_size or 0) > 0 else int(sa.max_prefill_tokens)
        elems = ulysses.pad_to_sp(tokens, sp) * ModelShapes.of(runner.model_config.hf_config.to_dict()).qkv_width(p)
        try:
            exchange = SymmetricExchange(sp_comm.device_group, sp_comm.rank_in_group, sp, elems,
                                         runner.model_config.dtype, torch.device("cuda", torch.cuda.current_device()))
        except ExchangeError as e:
            raise ShiftError(f"--shift-all-to-all overlap: {e}; --shift-all-to-all nccl needs none") from None
        logger.info("sgl-sidp shift TP%d: base exchanges by copies into the SP peers' memory behind the QKV and O "
                    "GEMMs (torch symmetric memory, %.0f MB on this GPU for forwards of up to %d tokens; larger "
                    "ones by NCCL)", _tp_rank(), exchange.nbytes / 1e6, tokens)
        return exchange

    def on_load_model(self, result, runner, *args, **kwargs):
        """AFTER `ModelRunner.load_model`: base weights and views (`adopt`), before SGLang sizes the KV cache."""
        if getattr(runner, "is_draft_worker", False) or self.sp_comm is None:
            return result
        gb = self.adopt(runner.model)
        torch.cuda.empty_cache()
        if not self.settings.threshold:
            from sgl_sidp.calibration.cache import CalibrationCache
            from sgl_sidp.calibration.startup import calibration_key

            cache = CalibrationCache()
            cached = cache.get_extra(calibration_key(runner), self.cache_name)
            if cached is not None:
                self.threshold = float(cached["threshold"])
                self.threshold_source = f"start-up calibration cached in {cache.dir}"
        logger.info("sgl-sidp shift TP%d: base (SP=%d, TP=%d) as SP rank %d, shift (TP=%d) on views of the base "
                    "weights; the base weights add %.2f GB on this GPU; base above %s tokens per forward (%s)",
                    _tp_rank(), self.sp, self.tp_b, self.sp_rank, self.p, gb, self.threshold,
                    self.threshold_source)
        return result

    # ------------------------------------------------------------------ forward hooks
    def around_embedding(self, original: Callable, module, input_, *args, **kwargs):
        """AROUND `VocabParallelEmbedding.forward`: decide the configuration; base: this SP rank's tokens."""
        out = original(module, input_, *args, **kwargs)
        if id(module) != self.embed_id:
            return out
        self.n_tokens = int(input_.shape[0])
        self.base = self.base_for(self.n_tokens)
        return ulysses.local_tokens(out, self.sp, self.sp_rank) if self.base else out

    def around_qkv(self, original: Callable, module, x, *args, **kwargs):
        """AROUND `QKVParallelLinear.forward`: base: base QKV GEMM, then every token for this GPU's heads."""
        if not (self.base and self.roles.get(id(module)) == "qkv"):
            return original(module, x, *args, **kwargs)
        w, b = self.weights[id(module)]
        if self.exchange is not None:
            got = ulysses.heads_exchanged(x, w, b, self.n_tokens, self.exchange)
            if got is not None:
                return got, None
            self._beyond_buffer(x.shape[0] * self.sp)
        return ulysses.heads_all_to_all(ulysses.column_blocks(x, w, b, self.sp), self.n_tokens, self.sp_comm), None

    def _beyond_buffer(self, tokens: int) -> None:
        if not self.too_large:
            logger.info("sgl-sidp shift TP%d: a base forward of %d tokens exceeds the exchange's buffer; such forwards "
                        "exchange by NCCL", _tp_rank(), tokens)
        self.too_large += 1

    def around_row_linear(self, original: Callable, module, x, *args, **kwargs):
        """AROUND `RowParallelLinear.forward`: base o_proj: this rank's tokens with the SP group's heads, base O GEMM.
        Qwen3/Qwen2 build o_proj unreduced (the all-reduce follows in the communicator, `around_attn_all_reduce`);
        Llama's reduces in o_proj itself: over the TP_b group here."""
        if not (self.base and self.roles.get(id(module)) == "o"):
            return original(module, x, *args, **kwargs)
        w, _ = self.weights[id(module)]
        out = None if self.exchange is None else ulysses.tokens_exchanged_gemm(x, w, self.exchange)
        if out is None:
            blocks = ulysses.tokens_all_to_all(x, self.sp, self.sp_comm)
            if self.settings.exact:  # summed over every TP rank here: the all-reduce that follows has nothing to add
                return self.row_gemm_exact(blocks, w), None
            out = ulysses.row_blocks_gemm(blocks, w)
        if getattr(module, "reduce_results", False) and self.tb_comm is not None:
            out = self.tb_comm.all_reduce(out)
        return out, None

    def around_attn_all_reduce(self, original: Callable, x, *args, **kwargs):
        """AROUND `attention_tensor_model_parallel_all_reduce`: base: over the TP_b group only (none at TP_b = 1, nor
        with `--shift-exact`, whose o_proj summed every rank's part)."""
        if not self.base:
            return original(x, *args, **kwargs)
        return self.tb_comm.all_reduce(x) if self.tb_comm is not None and not self.settings.exact else x

    def column_gemm(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """A column-parallel layer's base GEMM: x [N, K] by the base weight w [SP * n, K] (shard-major: SP shift
        shards) -> [N, SP * n]; with `--shift-exact`, one GEMM per shift shard, as each TP rank computes its own."""
        if not self.settings.exact or self.sp == 1:
            return F.linear(x, w, b)
        return torch.cat(tuple(ulysses.column_blocks(x, w, b, self.sp)), dim=-1)

    def row_gemm_exact(self, xs, w: torch.Tensor) -> torch.Tensor:
        """`--shift-exact`'s row-parallel layer: the SP inputs xs (each [N, k]: `tokens_all_to_all`'s blocks, or
        the column blocks of one [N, SP * k] input) by the base weight w [H, SP * k] as the P TP ranks compute it:
        one partial GEMM per shift shard (rounded to x's dtype, as each rank's output is), the TP_b group's partials
        all-gathered, all P added in TP-rank order (g = t * SP + s) by `ulysses.sum_in_rank_order`.
        Returns [N, H], the sum over every GPU (no all-reduce follows)."""
        parts = torch.stack([F.linear(x, ws) for x, ws in zip(xs, w.chunk(self.sp, -1))])
        if self.tb_comm is not None:
            gathered = parts.new_empty((self.tp_b * parts.numel(),))
            self.tb_comm.all_gather_into_tensor(gathered, parts.reshape(-1))
            parts = gathered.view(self.p, *parts.shape[1:])
        return ulysses.sum_in_rank_order(parts)

    def around_mlp(self, original: Callable, mlp, x, *args, **kwargs):
        """AROUND `Qwen2MLP.forward` / `LlamaMLP.forward`: base: gate|up and down on the base weights, SGLang's
        act_fn per shard, all-reduced over TP_b."""
        if not (self.base and self.roles.get(id(mlp)) == "mlp"):
            return original(mlp, x, *args, **kwargs)
        h = ulysses.act_per_shard(mlp.act_fn, self.column_gemm(x, self.weights[id(mlp.gate_up_proj)][0], None), self.sp)
        if self.settings.exact:
            return self.row_gemm_exact(h.chunk(self.sp, -1), self.weights[id(mlp.down_proj)][0])
        out = F.linear(h, self.weights[id(mlp.down_proj)][0])
        return self.tb_comm.all_reduce(out) if self.tb_comm is not None else out

    def around_logits(self, original: Callable, proc, input_ids, hidden_states, *args, **kwargs):
        """AROUND `LogitsProcessor.forward`: base: every SP rank's last hidden states, in token order, first."""
        if self.base and self.roles.get(id(proc)) == "logits":
            hidden_states = ulysses.gather_tokens(hidden_states, self.sp, self.n_tokens, self.sp_comm)
            before = kwargs.get("hidden_states_before_norm")
            if before is not None:
                kwargs["hidden_states_before_norm"] = ulysses.gather_tokens(before, self.sp, self.n_tokens, self.sp_comm)
            self.base = False  # the forward's layers are done
        return original(proc, input_ids, hidden_states, *args, **kwargs)

    def around_prefill_capture(self, original: Callable, graph_runner, *args, **kwargs):
        """AROUND `PrefillCudaGraphRunner.capture`: calibrate the threshold (neither given nor cached) on SGLang's
        dummy prefill bodies before the first graph is captured, so every graph is captured with it.

        Raises:
            ShiftError: SGLang chose a prefill backend other than breakable graphs by itself (`shift.feature.check`
                refuses the user's choice of one before any GPU work).
        """
        backend = str(graph_runner.prefill_backend_name)
        if backend != "breakable":
            raise ShiftError(f"--overlay-mode shift: SGLang chose the '{backend}' prefill CUDA graphs, which the base "
                             "configuration cannot run in; add --cuda-graph-backend-prefill breakable (or disabled)")
        if self.threshold_source.startswith("provisional") and self.sp_comm is not None:
            from sglang.srt.distributed.parallel_state import get_tp_group

            from sgl_sidp.calibration.measure import largest_over, time_dummy_prefill

            tp_group, timings = get_tp_group(), {}  # (tokens, configuration) -> QueuedTiming
            # every TP rank sleeps as long as the slowest one's host needs: the forwards hold TP collectives
            agree = largest_over(tp_group.cpu_group) if tp_group.world_size > 1 else None

            def gpu_ms(tokens: int) -> float:
                timing = time_dummy_prefill(graph_runner, tokens, align=tp_group.barrier, agree=agree)
                timings[(tokens, self.force)] = timing
                return timing.gpu_ms

            self.calibrate(graph_runner.model_runner, gpu_ms, graph_runner.max_num_tokens,
                           "dummy prefill bodies queued behind a GPU sleep, TP ranks aligned, before the prefill graphs")
            if _tp_rank() == 0:
                sizes = sorted({n for n, _ in timings})
                logger.info("sgl-sidp shift TP0: the same prefills timed from the host (launches included), ms (shift, "
                            "base) by tokens: %s", ", ".join(f"{n}: {timings[(n, 'shift')].eager_ms:.1f}, "
                                                             f"{timings[(n, 'base')].eager_ms:.1f}" for n in sizes))
                behind = sorted({n for (n, _), t in timings.items() if not t.ahead})
                if behind:
                    logger.warning("sgl-sidp shift TP0: at %s tokens the host was still launching when the GPU sleep "
                                   "ended, so those times include host gaps", behind)
            torch.cuda.empty_cache()
        return original(graph_runner, *args, **kwargs)

    def around_prefill_replay(self, original: Callable, graph_runner, forward_batch, static_forward_batch,
                              static_num_tokens: int, *args, **kwargs):
        """AROUND `PrefillCudaGraphRunner._execute_body_capture`: the replayed bucket ran the configuration it was
        captured in (the threshold is fixed before the prefill graphs exist); tell the eager logits tail."""
        self.n_tokens = int(static_num_tokens)
        self.base = self.base_for(self.n_tokens)
        return original(graph_runner, forward_batch, static_forward_batch, static_num_tokens, *args, **kwargs)

    def on_scheduler_init(self, result, scheduler, *args, **kwargs):
        """AFTER `Scheduler.__init__` (graphs captured, nothing served): which graphs run which configuration, the
        threshold calibration when it is neither given, cached nor measured before the prefill graphs, then the
        metrics."""
        mr = scheduler.tp_worker.model_runner
        graphs = getattr(mr, "decode_cuda_graph_runner", None)
        self.capture_bs = sorted(getattr(graphs, "capture_bs", None) or [])
        self.prefill_bs = sorted(getattr(getattr(mr, "prefill_cuda_graph_runner", None), "capture_num_tokens", None) or [])
        base_graphs = [b for b in self.capture_bs if self.base_for(b)]
        self.graph_base = set(base_graphs)
        base_prefill = [n for n in self.prefill_bs if self.base_for(n)]
        tp_rank = _tp_rank()
        logger.info("sgl-sidp shift TP%d: decode CUDA graphs in the base configuration: %s; in the shift "
                    "configuration: %d sizes", tp_rank, base_graphs or "none", len(self.capture_bs) - len(base_graphs))
        logger.info("sgl-sidp shift TP%d: prefill CUDA graphs: %d token buckets in the base configuration (%s), %d in "
                    "the shift configuration", tp_rank, len(base_prefill),
                    f"{base_prefill[0]}-{base_prefill[-1]}" if base_prefill else "none",
                    len(self.prefill_bs) - len(base_prefill))
        if self.threshold_source.startswith("provisional") and self.sp_comm is not None:
            room = min(scheduler.model_config.context_len - 1, scheduler.token_to_kv_pool_allocator.available_size() // 2)
            from sgl_sidp.calibration.measure import time_prefill

            self.calibrate(mr, lambda tokens: time_prefill(scheduler, tokens), room, "one-request prefills")
        collector = getattr(scheduler, "metrics_collector", None)
        if collector is not None:
            self.metrics = ShiftMetrics(self, dict(collector.labels))
        logger.info("sgl-sidp shift TP%d: ready; P=%d, base SP=%d TP=%d above %s tokens per forward (%s); exchanges "
                    "by %s", tp_rank, self.p, self.sp, self.tp_b, self.threshold, self.threshold_source,
                    "overlap" if self.exchange is not None else "nccl")
        return result

    def calibrate(self, runner, time_ms: Callable[[int], float], room: int, what: str) -> None:
        """Time prefills of the `CALIBRATION_TOKENS` up to `room` tokens in both configurations with `time_ms(tokens)`
        (every TP rank alike: the forwards hold TP collectives), let TP rank 0 pick the threshold, share it, and
        cache it. `runner`: SGLang's `ModelRunner`; `what`: the forwards timed, for the log."""
        import time

        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size, get_tp_group

        from sgl_sidp.calibration.cache import CalibrationCache
        from sgl_sidp.calibration.cost import shift_threshold
        from sgl_sidp.calibration.startup import calibration_key

        t0 = time.perf_counter()
        points = {}
        sizes = [t for t in CALIBRATION_TOKENS if t <= room]
        with Progress(f"sgl-sidp shift TP{_tp_rank()}: threshold calibration ({what})", logger) as progress:
            for i, tokens in enumerate(sizes, 1):
                ms = {}
                for config in ("shift", "base"):
                    progress.at(f"prefill of {tokens} tokens ({i} of {len(sizes)}) in the {config} configuration")
                    self.force = config
                    try:
                        ms[config] = time_ms(tokens)
                    finally:
                        self.force = None
                points[tokens] = (ms["shift"], ms["base"])
        threshold = shift_threshold(points) if points else math.inf
        tp0 = _tp_rank() == 0
        if get_tensor_model_parallel_world_size() > 1:
            threshold = get_tp_group().broadcast_object(threshold if tp0 else None, src=0)
        self.threshold = threshold
        self.threshold_source = f"start-up calibration ({time.perf_counter() - t0:.1f} s, {what})"
        if tp0:
            path = CalibrationCache().put_extra(calibration_key(runner), self.cache_name,
                                                {"threshold": threshold, "points": {str(t): v for t, v in points.items()}})
            logger.info("sgl-sidp shift TP0: prefill ms (shift, base) by tokens (%s): %s; threshold %s tokens (cached "
                        "in %s)", what, ", ".join(f"{t}: {a:.1f}, {b:.1f}" for t, (a, b) in points.items()),
                        threshold, path)
            verdict = base_never_pays(points, self.sp, self.tp_b)
            if verdict:
                logger.warning("sgl-sidp shift TP0: %s", verdict)


def base_never_pays(points: dict[int, tuple[float, float]], sp: int, tp_b: int) -> str | None:
    """The line a Shift server logs when its calibration puts no forward in the base configuration: the base
    configuration was slower than TP = SP x TP_b at the largest prefill measured, so every forward runs as vanilla
    TP = P does (while the base weights still take their memory), with the measured ratio there; None otherwise.

    Args:
        points: tokens in a forward -> (shift ms, base ms), as `calibrate` measured them.
        sp, tp_b: the base configuration's SP and TP sizes.
    """
    if not points:
        return None
    largest = max(points)
    shift_ms, base_ms = points[largest]
    if base_ms <= shift_ms:
        return None
    p = sp * tp_b
    return (f"the base configuration (SP{sp} x TP{tp_b}) was slower than TP={p} up to the largest prefill measured "
            f"({largest} tokens: {base_ms:.1f} ms against {shift_ms:.1f} ms, {base_ms / shift_ms:.2f}x), so every "
            f"forward runs in TP={p}, as vanilla --tp-size {p} serves, while the base weights still take their memory: "
            f"vanilla --tp-size {p} is predicted to serve as fast with more KV")


class ShiftMetrics:
    """Shift Parallelism's Prometheus metrics (with `--enable-metrics`), labelled like SGLang's scheduler metrics.

    - `sglang:sidp_shift_forwards_total{config}`: forwards by configuration ("base", "shift"), counted from the batch
      signal by the rule the forward ran under (a decode batch by its CUDA graph's captured size).
    - `sglang:sidp_shift_tokens_total{config}`: their tokens (a replayed graph counts its captured size).
    - `sglang:sidp_shift_switches_total`: changes of configuration between consecutive forwards.
    - `sglang:sidp_shift_threshold`: the threshold, tokens per forward.
    """

    def __init__(self, rt: ShiftRuntime, labels: dict, registry=None):
        from prometheus_client import REGISTRY, Counter, Gauge

        reg = REGISTRY if registry is None else registry
        kw = dict(labelnames=list(labels), registry=reg)
        Gauge("sglang:sidp_shift_threshold", "Tokens per forward above which the base configuration runs.",
              multiprocess_mode="mostrecent", **kw).labels(**labels).set(rt.threshold)
        by = dict(labelnames=[*labels, "config"], registry=reg)
        forwards = Counter("sglang:sidp_shift_forwards", "Forwards by configuration.", **by)
        tokens = Counter("sglang:sidp_shift_tokens", "Tokens of the forwards by configuration.", **by)
        self.forwards = {c: forwards.labels(**labels, config=c) for c in ("base", "shift")}
        self.tokens = {c: tokens.labels(**labels, config=c) for c in ("base", "shift")}
        self.switches = Counter("sglang:sidp_shift_switches", "Changes of configuration.", **kw).labels(**labels)

    def on_forward(self, config: str, tokens: int, switched: bool) -> None:
        self.forwards[config].inc()
        self.tokens[config].inc(tokens)
        if switched:
            self.switches.inc()
