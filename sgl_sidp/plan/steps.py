"""A configuration's step times, predicted: its shards' forward times measured on one GPU (calibrations, looked up by
each shard's model signature), plus the collectives and weight copies the configuration adds (`comm.Interconnect`),
decided with the one cost model the features use at run time (`sgl_sidp.calibration.cost`).

Per technique (L layers, h hidden, e bytes per element, b sequences or tokens in a forward; each composed by its
`technique.Technique` object: `sgl_sidp.plan.vanilla` for vanilla and DP attention, `sgl_sidp/<feature>/planner.py`
for ZeroDP, SiDP and Shift, from the pieces `StepModel` shares):

- vanilla TP t x DP d: the TP-t shard's forward + 2L all-reduces of b x h x e bytes over t. Replicas are independent.
- DP attention over N GPUs (SGLang's `--enable-dp-attention`): the shard with whole attention and the FFN split N
  ways, timed at each rank's own b; its FFN sees every rank's tokens, so its FFN's share of the linear time of N x b
  tokens less that of b is added (1/N of the FFN against the whole attention: `gathered_ffn_share`), and per layer an
  all-gather and a reduce-scatter of N x b x h x e bytes; prefill chunks of 8,192 / N tokens
  (`planner.replica_limits`, as SGLang sets them). The ranks
  step together (SGLang's MLP sync per iteration): the simulation starts each iteration when the slowest rank's
  forward has ended (`sim.simulate_lockstep`; SiDP's CaS and auto alike).
- ZeroDP (MoE, d replicas of TP t): the source replica is vanilla; a sink pulls its offloaded layers' routed experts
  each forward from the source's HBM: a forward takes max(compute + the copies' measured slowdown, the copies at the
  in-forward copy rate, the source's egress shared by its d - 1 sinks). The offloaded layers are the count that
  maximizes capacity-bound decode tokens/s (`cost.best_offload_count`, the policy ZeroDP runs with
  `--zerodp-expected-batch kv:C`).
- SiDP (dense, d ranks of TP t): every rank holds its own 1/d of the FFN layers. WaS streams the other (d-1)/d of
  the FFN weights every forward (as a ZeroDP sink, each rank's egress serving the others); CaS sends each layer's
  rows to its owner, which runs that layer's FFN on every rank's rows (the FFN's share of d x b tokens' linear time,
  plus an all-gather and a reduce-scatter of d x b x h x e bytes per layer); auto runs WaS at b >= B_th and CaS
  below, B_th being the batch from which WaS is predicted faster (`StepModel.b_th`).
- Shift (dense, base SP x TP_b = P GPUs, one KV cache): a forward of b tokens runs the shift configuration (the TP-P
  shard + its all-reduces) when b <= the threshold, else the base configuration: the TP_b shard on b / SP tokens
  (decode attention is the same work: b / SP sequences x H / TP_b heads = b x H / P), a prefill's attention 1/SP of
  the TP_b shard's (heads / P over the whole sequence), 2 all-to-alls per layer over SP (QKV in, attention out) and
  the TP_b all-reduces of b / SP tokens. The threshold is `cost.shift_threshold` of the two, as Shift's runtime
  picks it.

Every technique: a decode step lasts the GPU's forward or the host's work, whichever is longer. The host runs the
scheduler's work for each running request (`ShardClock.host_ms`, where the calibration measured it), and for a batch
past SGLang's largest decode graph (`memory.default_decode_graph_max_bs` of the server's TP size: 256 below TP4 on
H200), which runs eagerly, the kernel launches too: the shard's calibrated eager step (`ShardClock.eager_ms`).

Left out: CPU launch time of eager forwards elsewhere (CaS without graphs), what eager steps cost more on several
ranks (on 2 x H200 a TP2 step of 512 rows: 40 ms against its shard's 32 ms), and how fast the host runs: a
launch-bound eager step takes as long as the vCPU the scheduler landed on makes it. On one lent H200 VM, Qwen3-8B TP1's
eager steps of 384 rows at about 1,100 tokens of context settled per burst at 28.5-29.9 ms (the GPU's step, as
priced here) or at 43.8-47.5 ms (host-bound: launches 35-41 ms, 9.5 ms between forwards), and that VM's vCPUs ran a
spinning Python loop 1.0-1.7x apart (`q8_eager_si*_1gpu_h200`, `q8_eager_late_1gpu_h200`, `q8_flags_1gpu_h200`);
the same spread showed on 2 x H200 (TP2's eager steps at 35-40 ms in one run, 55-70 in another); imbalance between
DP ranks, the overlap of collectives with compute, the vocabulary split's effect on a shard's lm_head where the shard
signature (`model_info.model_signature`, which has no vocabulary) matches a calibration of another vocabulary split.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import statistics
from pathlib import Path
from typing import Callable, Mapping, Sequence

from sgl_sidp.calibration.cache import BUNDLED_DIR, calibration_files, default_cache_dir
from sgl_sidp.calibration.cost import DEFAULT_COPY_RATE_IN_FORWARD, DEFAULT_COPY_SLOWDOWN_MS_PER_GB
from sgl_sidp.calibration.memory import GIB, ModelShapes
from sgl_sidp.calibration.table import Calibration, _interp, gpu_kind
from sgl_sidp.model_info import model_signature
from sgl_sidp.plan.comm import Interconnect
from sgl_sidp.plan.configs import Configuration, Shard
from sgl_sidp.plan.sim import StepTimes
from sgl_sidp.plan.what_if import NO_WHAT_IF, WhatIf

#: GPU kinds the planner knows: NVML's total MiB and the free GiB SGLang logged before loading a model at TP1.
GPUS = {"H200": {"name": "NVIDIA H200", "mib": 143_771, "free_before_load_gib": 139.13,
                 "source": "SGLang's 'Load weight begin. avail mem' at TP1, benchmarks/results/sidp/calibration_1gpu/"},
        "H100": {"name": "NVIDIA H100 80GB HBM3", "mib": 81_559, "free_before_load_gib": 78.50,
                 "source": "SGLang's 'Load weight begin. avail mem' at TP1, benchmarks/results/families/ (DeepSeek-V2 run)"}}


def gpu_key(gpu_name: str | None) -> str | None:
    """The `GPUS` key of a GPU named as NVML or a table names it ("NVIDIA H100 80GB HBM3", "H100" -> "H100"), matched
    by kind (`calibration.table.gpu_kind`); None for no name or a kind the planner does not know."""
    return next((k for k in GPUS if gpu_name and gpu_kind(k) == gpu_kind(gpu_name)), None)


#: GiB a replica's TP group of 2 or 4 GPUs takes before the model loads (NCCL communicators, SGLang's custom all-reduce
#: buffers), by GPU kind: TP1's 'avail mem' less the group's, from the servers of benchmarks/results/multi_gpu/ (one
#: server per GPU set; H100: TP2 and DP attention 2 77.58-77.59, TP4 77.36-77.41; H200: TP2 138.21, TP4 137.99).
#: A Shift server reserves more beside (sp2 77.05 on H100, sp2 x tp2 137.16 on H200): `shift.planner.RESERVE_GIB`,
#: from its KV pools. Groups of more than 4 GPUs take the 4-GPU figure (not measured).
GROUP_RESERVE_GIB = {"H100": {2: 0.91, 4: 1.12}, "H200": {2: 0.92, 4: 1.14}}


#: How much longer a served prefill forward's linears and attention take than the calibration's short timing of them,
#: by GPU kind (`GPUS` key; others 1.0): the calibration times each prefill for a fraction of a second, a busy server
#: runs them back to back for seconds, and an H200 at its 700 W limit clocks its GEMMs down over that span. H200:
#: Llama-3.1-70B's layer GEMMs ran 19.8-19.9 ms a layer timed over 0.4 s and 20.4 ms over 8 s, 1.028x
#: (`benchmarks/results/multi_gpu/gemm_sustained_1gpu_h200`; ~692 W, 1,410-1,470 MHz in `pull_cost_4gpu_h200`). Not
#: measured on H100. It scales `prefill_fit`'s per-token terms, not its constant nor the small prefills' floor and ramp
#: (host-bound). What it is held to (`benchmarks/results/plan_multi_gpu/README.md`): with the H200 tables' prefills of
#: several prompts (`Calibration.prefill_multi_ms`, `calibrate_q8`, `calibrate_q32_4`), the planner prices Qwen3-8B's
#: 4 x 2,048 chunk at 128.3 ms on TP2 and 114.5 on Shift SP2, where the server's forwards spanned 125-131 and 112-118
#: (`q8_shift_prof_2gpu_h200`), and the H200 bursts' throughput comes within 2.3 % (median, 77 configurations; 2.8 %
#: before). Forwards whose all-reduces leave the GPU idle spells run nearer the short timing (`pull_gap_4gpu_h200`), so
#: TP4 is now under-predicted by 3.1 % on average: the factor does not depend on a configuration's communication.
PREFILL_SUSTAINED_FACTOR = {"H200": 1.028}

#: ms a prefill forward slows per GB of weights pulled into its GPU during it, by GPU kind (`GPUS` key); other kinds
#: take the decode step's (`calibration.cost.DEFAULT_COPY_SLOWDOWN_MS_PER_GB`, 0.327, or the calibration's). H200:
#: SiDP DP4 WaS on Llama-3.1-70B, a 4 x 2,048-token forward that pulls 84.6 GB (60 non-owned FFNs) ran 1,866-1,892 ms
#: on 3 GPUs (torch profiler, `benchmarks/results/multi_gpu/l70_sidp_prof_4gpu_h200`), where the TP1 shard alone ran
#: 1,752 ms (`plan calibrate` the same hour, cal_l70), 1,801 at the sustained clock (`PREFILL_SUSTAINED_FACTOR`):
#: (1,877 - 1,801) / 84.6 = 0.90 (1.48 before the sustained clock was priced apart). On H100 SiDP's profiled
#: 2 x 4,096 forward (1,953 ms, `l70_profile_4gpu_h100`) sits within 1 % of the decode rate's price, so H100 keeps it.
#: The pulls themselves, timed beside the GEMMs at 45-133 GB/s (SiDP's run at ~360), cost them 0.25-0.63 ms per GB
#: (`bench.pull_cost`, `pull_cost_4gpu_h200`); outside its GEMMs SiDP's forward spends what TP2 x DP2's does per
#: GPU-second (`l70_tp2dp2_prof_4gpu_h200`). So 0.90 is a fit for SiDP's pulled share (60 of 80 layers at DP4), not a
#: copy cost. A ZeroDP sink's prefill pulls take the same rate (not validated there: none of the multi-GPU runs the
#: planner is held to offloaded on H200).
PREFILL_COPY_SLOWDOWN_MS_PER_GB = {"H200": 0.90}


def group_reserve_gib(group: int, gpu: str = "H100") -> float:
    """GiB a `group`-GPU TP group takes on each GPU before the model loads (`GROUP_RESERVE_GIB` of GPU kind `gpu`, a
    `GPUS` key; H100's for another kind: the kinds measured differ by 0.02 GiB at most); 0 for one GPU."""
    reserve = GROUP_RESERVE_GIB.get(gpu, GROUP_RESERVE_GIB["H100"])
    return 0.0 if group <= 1 else reserve.get(group, reserve[max(k for k in reserve if k <= group)])


def free_before_load_bytes(gpu: str, group: int) -> int:
    """Bytes SGLang finds free on each GPU of a `group`-GPU TP group of GPU kind `gpu` (a `GPUS` key) just before it
    loads the model: the TP1 figure (`GPUS`) less the group's reserve (`group_reserve_gib`)."""
    return int((GPUS[gpu]["free_before_load_gib"] - group_reserve_gib(group, gpu)) * GIB)

#: Where one source's egress saturates when several readers pull from it at once (GB/s, H200, measured by ZeroDP:
#: benchmarks/results/zerodp/README.md); the peer-copy entry of the interconnect table is one idle pair's rate.
SOURCE_EGRESS_GBPS = 350.0

#: prefills of at least this many tokens fix the prefill fit (`ShardClock.prefill_fit`); smaller ones its floor and the
#: ramp from the floor to the fit (`ShardClock.prefill_ramp`). Below 2,048 tokens a one-request prefill is mostly the
#: host's launches on the lent GPUs (16-512 tokens: 12-19 ms on 2 x H100, 7-9 ms on H200), and such points in the
#: least-squares fit lowered its per-token slope: Qwen3-8B's TP2 prefills of 4 x 2,048 tokens were predicted 16 % under
#: the profiled 129 ms, and that TP2 burst 18-20 % over its measured throughput (2,048: within 3 % of it)
PREFILL_FIT_FROM = 2048

#: the cached prefix (tokens) at which the new tokens' discount on attention over it (`ShardClock.prefix_new_scale`'s r,
#: measured at 8,192 cached) has faded back to 1, linearly from its probe's prefix. Fitted on one H200: of 16,384 (the
#: line's longest probe, the first fade), 24,576, 28,672, 32,768, 40,960 and never (r held), 28,672-32,768 fit the
#: 18 lone prefills of 8,192 new tokens over 16K-24K cached and the 24,576-token fresh prompts (TP1 and TP2 shards of
#: Qwen3-8B, Qwen3-32B and Qwen3-30B-A3B; TTFT rms error 1.8-2.1 %, 4.4 % at 16,384, 6.1 % held), and 32,768 the GPU
#: time SGLang's device timer gave the prefill forwards of four busy Mooncake replays and of two probe replays best of
#: those two (+1.3 to +3.3 %; +3.5 to +7.4 % at 16,384, -4.2 to +1.5 % held):
#: `benchmarks/results/plan_multi_gpu/prefix_line.md`
PREFIX_FADE_END = 32768

#: decode steps are predicted at contexts rounded to this many tokens (`StepModel.decode_ms`)
CONTEXT_STEP = 32


def shard_config(hf: Mapping, shard: Shard, **more) -> dict:
    """The config SGLang runs for `shard` of `hf`: the text config with `shard.override_args` and `more` on top."""
    cfg = dict(hf.get("text_config", hf))
    cfg.update(shard.override_args(ModelShapes.of(hf)), **more)
    return cfg


def shard_signature(hf: Mapping, shard: Shard, **more) -> str:
    """The calibration signature (`model_info.model_signature` at TP1) of SGLang running `hf` with `shard`'s sizes
    (and the config keys `more`, e.g. fewer `num_hidden_layers`)."""
    return model_signature(shard_config(hf, shard, **more), 1)


def find_calibration(signature: str, gpu_name: str, dirs: list[Path] | None = None) -> tuple[Calibration, Path] | None:
    """A calibration of `signature` on a GPU of `gpu_name`'s kind: in the start-up cache (`$SIDP_CALIBRATION_DIR`)
    or bundled with the package, as cache entries (`{"key", "calibration"}`) or plain tables."""
    for f, data in calibration_files(dirs if dirs is not None else [default_cache_dir(), BUNDLED_DIR]):
        cal = data.get("calibration", data)
        try:
            if cal.get("model") == signature and gpu_kind(str(cal.get("gpu"))) == gpu_kind(gpu_name):
                return Calibration.from_json(cal), f
        except (ValueError, KeyError, AttributeError, TypeError):
            continue
    return None


def _entries_of_kind(gpu_name: str, dirs: list[Path] | None):
    """The cached or bundled calibration entries (`{"key", "calibration", ...}`) measured on `gpu_name`'s kind."""
    for _, data in calibration_files(dirs if dirs is not None else [default_cache_dir(), BUNDLED_DIR]):
        try:
            if gpu_kind(str(data["calibration"]["gpu"])) == gpu_kind(gpu_name):
                yield data
        except (KeyError, TypeError):
            continue


def model_part(signature: str) -> str:
    """The words of a shard signature that name the model, not the shard: architecture, layers, experts, hidden size
    ("Qwen3ForCausalLM L36 H4096 I6144 A16/4 tp1" -> "Qwen3ForCausalLM L36 H4096")."""
    words = signature.split()
    hidden = next((i for i, w in enumerate(words) if w.startswith("H") and w[1:].isdigit()), len(words) - 1)
    return " ".join(words[:hidden + 1])


def _entry_median(gpu_name: str, dirs: list[Path] | None, model: str | None, read) -> tuple[float | None, int, bool]:
    """(median, over how many shards, whether they are `model`'s) of `read(entry)` over the cached or bundled entries
    of this GPU kind: over the shards of `model` (a signature's `model_part`) where any has it, else over all; (None,
    0, False) if none has it (`read` raises KeyError, TypeError or ValueError where an entry lacks it)."""
    found = {}
    for data in _entries_of_kind(gpu_name, dirs):
        try:
            found[str(data["calibration"]["model"])] = float(read(data))
        except (ValueError, KeyError, TypeError):
            continue
    own = [v for sig, v in found.items() if model is not None and model_part(sig) == model_part(model)]
    values = own or list(found.values())
    return (statistics.median(values) if values else None), len(values), bool(own)


def request_overhead_ms(gpu_name: str, dirs: list[Path] | None = None, model: str | None = None) -> tuple[float, str]:
    """(ms, where from) a request spends outside forwards before its first token on this GPU kind (HTTP server,
    tokenizer manager, scheduler, detokenizer): the median of what `plan calibrate` measured with each shard it
    served (`calibrate.record_request_overhead`, in the cached or bundled entries), over the shards of `model` (a
    signature's `model_part`) where any has it (it grows with the model: 4-6 ms for Qwen3-8B on H200, 8-18 ms for
    Llama-3.1-70B), else over every shard of this GPU kind; (0.0, "not measured") if none."""
    ms, n, own = _entry_median(gpu_name, dirs, model, lambda d: d["request_overhead_ms"]["median_ms"])
    if ms is None:
        return 0.0, "not measured"
    if own:
        return ms, f"median of {n} of this model's shards' client TTFT less their prefill"
    return ms, f"median of {n} shards' client TTFT less their calibrated prefill"


def stream_rate_at(stream: dict, mean_index: float | None = None) -> float:
    """The tokens per second one calibration entry's "stream" (`calibrate.record_stream_rate`, `record_stream_length`)
    says the tokenizer manager delivers, for tokens whose mean place in their request's output is `mean_index` (1:
    first tokens).

    SGLang's streamed chunk carries the whole output so far, so a token costs the stream c0 + c1 x its place. Where
    the longer probe found the stream bound (`calibrate.record_stream_length`), the line through its rate and the
    shorter probe's at their mean places ((L + 1) / 2 of outputs of L tokens) gives c0 and c1 (each at least 0); the
    shorter probe's delivered rate stands in for its stream's where the GPU bounded it (a lower bound: the line is
    then no steeper than the stream's). Else the shorter probe's bound rate is taken whatever the place (as before
    2026-11-28). On a stand-in of SGLang's stream the client's own intake fell 47 % from 128 to 512 tokens a request
    (`bench.stream`); SGLang's own server on one H200 host did not fall (Qwen3-8B's shards streamed 15.6-20.6K
    tokens/s at 128 tokens and 17.9-23.7K at 512, `benchmarks/results/plan_multi_gpu/h200/calibrate_q8_stream/`), so
    the bundled tables hold the shorter probe alone.

    Raises:
        KeyError, TypeError: neither probe found the stream bound.
    """
    long = stream.get("long") or {}
    if mean_index is None or not long.get("tokens_per_s"):
        return float(stream["tokens_per_s"])
    k1, k2 = ((float(p[2]) + 1) / 2 for p in (stream["probe"], long["probe"]))
    t1, t2 = 1 / float(stream["tokens_per_s"] or stream["delivered_tokens_per_s"]), 1 / float(long["tokens_per_s"])
    c1 = max(0.0, (t2 - t1) / (k2 - k1)) if k2 != k1 else 0.0
    c0 = max(0.0, t1 - c1 * k1)
    return 1 / (c0 + c1 * mean_index)


def stream_tokens_per_s(gpu_name: str, dirs: list[Path] | None = None, model: str | None = None,
                        mean_index: float | None = None) -> float | None:
    """The tokens per second SGLang's one tokenizer manager streams to clients on this host, whatever the number of
    DP replicas (`sim.deliver`), for a workload whose output tokens sit `mean_index` into their requests' outputs on
    average (`output_mean_index`; None: the probe's): the median over the shards `plan calibrate` measured where the
    stream, not the GPU, bounded its burst (`stream_rate_at`), as `request_overhead_ms` takes its median; None if
    none did."""
    return _entry_median(gpu_name, dirs, model, lambda d: stream_rate_at(d["stream"], mean_index))[0]


def output_mean_index(output_lens) -> float:
    """The mean place of an output token in its request's output (1: the first), over every token of requests of
    `output_lens` tokens: sum L (L + 1) / 2 over sum L (1.0 for no tokens)."""
    lens = list(output_lens)
    total = sum(lens)
    return sum(n * (n + 1) / 2 for n in lens) / total if total else 1.0


def host_time_alone_ms(gpu_name: str, dirs: list[Path] | None = None) -> float | None:
    """What a decode forward timed alone adds over one in a pipeline of forwards on this GPU kind (ms): the host's
    preparation of the step, which SGLang's overlap scheduler hides behind the previous step. The median, over every
    point of the calibrations measured both ways (`decode_timing` "pipelined" with `decode_ms_alone`), of the
    difference; None if there are none. `Calibration.pipelined` takes it off tables timed alone (measured before
    pipelined timing): 0.34 ms on H200 (126 points, 2026-11-24)."""
    diffs = []
    for data in _entries_of_kind(gpu_name, dirs):
        cal = data["calibration"]
        if cal.get("decode_timing") == "pipelined" and "extrapolated" not in str(cal.get("source", "")):
            alone = cal.get("decode_ms_alone", {})
            diffs += [float(alone[b]) - float(ms) for b, ms in cal.get("decode_ms", {}).items() if b in alone]
    return statistics.median(diffs) if diffs else None


@dataclasses.dataclass(frozen=True)
class ShardClock:
    """One shard's forward times on one GPU, from its calibration (ms).

    Attributes:
        cal: the shard's calibration (decode steps by batch at two contexts, one-request prefills).
        kv_bytes_per_token: the shard's KV bytes per token (all layers), for the context term of decode steps.
        what_if: numbers set by hand in place of the calibration's (`prefix_factor`, `host_ms`; validation
            scripts' sensitivity checks); `NO_WHAT_IF`: none.
        served_prefill: what the technique's served prefill forwards of this shard take beyond the sustained clock's
            price (`technique.Technique.served_prefill_factor`; dimensionless, 1.0: nothing).
    """

    cal: Calibration
    kv_bytes_per_token: int
    what_if: WhatIf = NO_WHAT_IF
    served_prefill: float = 1.0
    #: `decode_ms`'s answers, (batch, whole context) -> ms: each computed once, for every `StepModel` given an equal
    #: clock (`shared_clock`; a planning run asks the same shards, under several configurations, for thousands)
    _decode_memo: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def decode_ms(self, batch: float, context: float) -> float:
        """A decode step of `batch` sequences of `context` tokens: the calibration's (`Calibration.decode_step_ms`),
        extended past its largest batch along the slope of its two largest batches."""
        key = (batch, int(context))
        ms = self._decode_memo.get(key)
        if ms is None:
            ms = self._decode_memo[key] = self._decode_uncached(batch, int(context))
        return ms

    def _decode_uncached(self, batch: float, ctx: int) -> float:
        xs, kv = self.cal.decode_batches, self.kv_bytes_per_token
        step = self.cal.decode_step_ms
        if batch <= xs[-1] or len(xs) < 2:
            return step(batch, ctx, kv)
        last = step(xs[-1], ctx, kv)
        slope = (last - step(xs[-2], ctx, kv)) / (xs[-1] - xs[-2])
        return last + slope * (batch - xs[-1])

    @functools.cached_property
    def _eager_table(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        xs = tuple(sorted(self.cal.decode_ms_eager))
        return xs, tuple(self.cal.decode_ms_eager[x] for x in xs)

    def eager_ms(self, batch: float) -> float:
        """The calibrated eager decode step of `batch` rows (ms; `Calibration.decode_ms_eager`, interpolated in the
        batch, clamped at the ends); 0 for a calibration without eager points. Eager steps are bound by the host's
        kernel launches: on one H200 a Qwen3-8B shard took 19-35 ms eagerly at batch 256 and 512 whether its graph
        step took 3 or 11 ms."""
        xs, ys = self._eager_table
        return _interp(batch, xs, ys) if xs else 0.0

    def host_ms(self, batch: float) -> float:
        """The scheduler's host work of one decode step of `batch` running requests outside the forward (ms;
        `Calibration.host_ms_per_request` x batch, 0 where not measured; the what-if's
        `WhatIf.host_ms_per_request` x batch where it sets one)."""
        if self.what_if.host_ms_per_request is not None:
            return self.what_if.host_ms_per_request * batch
        per_request = self.cal.host_ms_per_request
        return per_request * batch if per_request else 0.0

    def more_tokens_ms(self, tokens: float, factor: float) -> float:
        """What the linear layers of a forward cost more when `tokens` become `factor` x `tokens` (no KV read: decode
        steps at context 0; past the largest calibrated batch, the prefill fit's per-token slope)."""
        def linear(t):
            largest = self.cal.decode_batches[-1]
            if t <= largest:
                return self.decode_ms(t, 0)
            return self.decode_ms(largest, 0) + self.prefill_fit[1] * (t - largest)
        return max(0.0, linear(tokens * factor) - linear(tokens))

    @functools.cached_property
    def prefill_fit(self) -> tuple[float, float, float]:
        """(c ms, a ms per token, b ms per token^2) of a prefill forward of fresh prompts of n_i tokens taking
        c + a sum(n_i) + b sum(n_i^2): the linear layers and the causal attention, least squares with no term below 0
        (`nonnegative_fit`; clipping an unconstrained fit's negative b instead left Llama-3.1-70B's TP4 shard on H100 a
        line 12 % too steep) over the measured one-request prefills of at least `PREFILL_FIT_FROM` tokens where three
        are (below it a prefill costs about the same whatever its size: `prefill_floor`), else over all, and the
        prefills of several prompts in one forward (`Calibration.prefill_multi_ms`) where measured. One-request points
        alone cannot tell the attention's per-token work from the linear layers', so they put it all in b: a chunk of
        two 4,096-token prompts of Qwen3-32B's TP1 shard on H100 came out at 946 ms, where SiDP's profile took 1,011
        (the attention's part 178 against 234 ms); the several-prompt points set the two apart."""
        import numpy as np

        sizes = sorted(self.cal.prefill_ms)
        big = [t for t in sizes if t >= PREFILL_FIT_FROM]
        rows = [(1.0, float(t), float(t) ** 2, self.cal.prefill_ms[t]) for t in (big if len(big) >= 3 else sizes)]
        rows += [(1.0, float(k * n), float(k * n * n), ms) for k, n, ms in self.cal.prefill_multi_ms]
        x = np.array([r[:3] for r in rows], dtype=float)
        return nonnegative_fit(x, np.array([r[3] for r in rows], dtype=float))

    @functools.cached_property
    def prefill_floor(self) -> float:
        """The least a prefill forward costs (ms): the calibration's smallest one-request prefill when it is below
        `PREFILL_FIT_FROM` tokens (SGLang 0.5.17 runs a 16-token prefill of Qwen3-8B on an H200 in 12.3 ms, a
        512-token one in 14.3 ms), else 0."""
        small = min(self.cal.prefill_ms, default=PREFILL_FIT_FROM)
        return self.cal.prefill_ms[small] if small < PREFILL_FIT_FROM else 0.0

    @functools.cached_property
    def prefill_ramp(self) -> tuple[tuple[float, float], ...]:
        """The calibration's one-request prefills below `PREFILL_FIT_FROM` tokens, (tokens, ms) in order, then the fit at
        `PREFILL_FIT_FROM`: below it a prefill takes at least the line through them (SGLang 0.5.17 on 2 x H100:
        Qwen3-8B's TP2 shard 15.6 ms at 16 tokens, 18.5 ms at 512, 29.4 ms at 2,048; on H200 its TP1 12.3 ms at 16,
        14.3 ms at 512). Empty without such points."""
        small = sorted(t for t in self.cal.prefill_ms if t < PREFILL_FIT_FROM)
        if not small:
            return ()
        c, a, b = self.prefill_fit
        top = c + a * PREFILL_FIT_FROM + b * PREFILL_FIT_FROM ** 2
        return (*((float(t), float(self.cal.prefill_ms[t])) for t in small), (float(PREFILL_FIT_FROM), top))

    @functools.cached_property
    def prefix_factor(self) -> float:
        """What attention over a cached prefix costs per token pair, as a multiple of attention within the new tokens
        (`prefill_ms`' k where `prefix_line` has no line): the median over the calibration's prefills over a prefix
        (`Calibration.prefill_prefix_ms`) of (ms - the fresh prefill of the new tokens) / (2 b x new x prefix), at
        least 0; 1 without such points (SGLang's triton extend attention reads the prefix's KV through the request's
        token table, the new tokens' from the forward's own buffers: the same work, not necessarily the same speed).
        The what-if's `WhatIf.prefix_factor` where it sets one."""
        if self.what_if.prefix_factor is not None:
            return self.what_if.prefix_factor
        ks = [k for _, _, k in self._prefix_points]
        return max(0.0, statistics.median(ks)) if ks else 1.0

    @functools.cached_property
    def _prefix_points(self) -> tuple[tuple[int, int, float], ...]:
        """(new tokens, prefix tokens, k) of each calibrated prefill over a prefix (`prefix_factor`'s terms); none
        where the fit has no attention term (e.g. Mixtral-8x7B's TP1 on H200: 0 fits best)."""
        c, a, b = self.prefill_fit
        if b <= 0:
            return ()
        return tuple((n, p, (ms - (c + a * n + b * n * n)) / (2 * b * n * p))
                     for n, p, ms in self.cal.prefill_prefix_ms if n and p)

    @functools.cached_property
    def _line_points(self) -> tuple[tuple[tuple[int, int, float], ...], tuple[tuple[int, int, float], ...]]:
        """`_prefix_points` split in those `prefix_line` is fitted on and those `prefix_new_scale` sets apart: the
        probes of the most new tokens, where the others span 2x in prefix (else none apart)."""
        pts = self._prefix_points
        top = max((n for n, _, _ in pts), default=0)
        rest = tuple(pt for pt in pts if pt[0] < top)
        ps = [p for _, p, _ in rest]
        if len(set(ps)) >= 2 and max(ps) >= 2 * min(ps) and len(rest) < len(pts):
            return rest, tuple(pt for pt in pts if pt[0] == top)
        return pts, ()

    @functools.cached_property
    def prefix_line(self) -> tuple[float, float, int] | None:
        """k as a function of the prefix p, (alpha, beta, p_max): k(p) = alpha + beta x min(p, p_max), the least-squares
        line through the calibration's (prefix, k) points (`_prefix_points`), held at its value at the largest probed
        prefix beyond it. None (k is `prefix_factor` at every p) with a what-if k, or where the probes' prefixes span
        less than 2x, or the line falls with p or starts at or below 0 (too few or noisy points to say more).

        Why: the attention over a prefix costs more per token pair the longer the prefix. The bundled probes (2,048
        new tokens over 8,192 and 16,384 cached, 8,192 over 8,192) give k 1.2 at 8,192 and 1.7 at 16,384 on most
        shards (H100 and H200; the cause, e.g. the prefix's KV outgrowing L2, is not established), and DP
        attention's 4,096-token chunks over 4,096 of their prompt, profiled on 2 x H200, ran at k = 1.0
        (`benchmarks/results/plan_multi_gpu/prefix_line.md`), where the line gives 0.95; one median k put them 6 %
        slow and the prompts over 16K-token radix hits of the Mooncake replays fast."""
        if self.what_if.prefix_factor is not None:
            return None
        pts = [(p, k) for _, p, k in self._line_points[0]]
        ps = [p for p, _ in pts]
        if len(set(ps)) < 2 or max(ps) < 2 * min(ps):
            return None
        mp, mk = statistics.fmean(ps), statistics.fmean(k for _, k in pts)
        beta = sum((p - mp) * (k - mk) for p, k in pts) / sum((p - mp) ** 2 for p in ps)
        alpha = mk - beta * mp
        if beta < 0 or alpha <= 0:
            return None
        return alpha, beta, max(ps)

    @functools.cached_property
    def prefix_new_scale(self) -> tuple[float, float, float, float] | None:
        """How k scales with a request's new tokens n and its prefix p, (n_lo, n_hi, r, p_at): 1 up to n_lo new
        tokens, r from n_hi, between them linear in log n; that up to a prefix of p_at, then back to 1 linearly at
        `PREFIX_FADE_END` cached tokens and past it (held at p_at's where p_at is not below it). `prefix_line` is
        fitted on the probes of fewer new tokens (n_lo, the most of them) and r is the median of k / the line's k of
        the probes of the most (n_hi), at their prefix p_at. None: one size of probes, or no line.

        Why: the probes of 8,192 new tokens over 8,192 cached come out at 0.28-1.04x (median about 0.9; the TP
        shards, whose fewer heads leave a short query over a long prefix less parallel work, 0.64-0.80x) of the line
        the probes of 2,048 new tokens set, on every bundled table. Why it fades with the prefix: the same 8,192 new
        tokens over 16,384 and 24,576 cached, served one at a time on one H200, ran at 0.87-0.89x and 0.90-0.98x the
        line on the TP2 shards of Qwen3-8B and Qwen3-30B-A3B, 0.96-1.04x on the other shards and TP1
        (`benchmarks/results/plan/validate_1gpu_h200_prefix_probes_2026-11-29/`), and SGLang's device timer puts the
        GPU time of those probes and of busy Mooncake replays' prefills between the discount held and the discount
        faded by 16K: `PREFIX_FADE_END` says where the fade ends now, and why."""
        line, (fitted, apart) = self.prefix_line, self._line_points
        if line is None or not apart:
            return None
        alpha, beta, p_max = line
        ratio = statistics.median(k / (alpha + beta * min(p, p_max)) for _, p, k in apart)
        return float(max(n for n, _, _ in fitted)), float(apart[0][0]), ratio, float(max(p for _, p, _ in apart))

    def prefill_ms(self, parts, share: float = 1.0) -> float:
        """One prefill forward of `parts`, each request's (new tokens, tokens already in its KV): c + share x (a x new
        tokens + b x each request's attention, new x (new + 2 k x prefix)) (`prefill_fit`; k from `prefix_line` at
        that prefix, scaled by the request's new tokens, `prefix_new_scale`, else `prefix_factor`), at least
        `prefill_floor` and, below `PREFILL_FIT_FROM` new tokens on this GPU, the `prefill_ramp` line; `share` < 1
        when this GPU runs only that part of the tokens' linears and attention (Shift's base configuration: 1/SP)."""
        c, a, b, k2, line, floor, ramp = self._prefill_terms
        new = attention = 0
        for n, p in parts:  # one loop, not two sums of generators: the simulation calls this for every prefill
            new += n
            if line and p:  # 2 k(p) = 2 alpha + 2 beta x min(p, p_max), times the new tokens' scale
                k = (line[0] + line[1] * (p if p < line[2] else line[2])) * p
                scale = line[3]
                if scale and n > scale[0]:
                    r = scale[2] if n >= scale[1] else 1.0 + (scale[2] - 1.0) * math.log(n / scale[0]) / scale[3]
                    if p > scale[4] and scale[5]:  # faded back to 1 from p_at to PREFIX_FADE_END
                        left = scale[4] + scale[5] - p  # cached tokens short of the fade's end
                        r = 1.0 + (r - 1.0) * left / scale[5] if left > 0 else 1.0
                    k *= r
                attention += n * (n + k)
            else:
                attention += n * (n + k2 * p)
        ms = c + share * (a * new + b * attention)
        here = share * new  # new tokens through this GPU's linears
        if ramp and here < PREFILL_FIT_FROM:
            t0, m0 = ramp[0]
            for t1, m1 in ramp[1:]:  # the segment of the line that holds `here` (a few points)
                if here <= t1:
                    low = m0 + (m1 - m0) * (here - t0) / (t1 - t0) if here > t0 else m0
                    floor = low if low > floor else floor
                    break
                t0, m0 = t1, m1
        return ms if ms > floor else floor  # max(floor, ms)

    @functools.cached_property
    def _prefill_terms(self) -> tuple[float, float, float, float, tuple | None, float, tuple]:
        """`prefill_ms`'s constants, (c, a, b) of `prefill_fit`, 2 x `prefix_factor`, `prefix_line` as (2 alpha,
        2 beta, p_max, `prefix_new_scale` as (n_lo, n_hi, r, log(n_hi / n_lo), p_at, `PREFIX_FADE_END` - p_at or 0)
        or None) or None, `prefill_floor` and `prefill_ramp`, read as one attribute: the simulation calls it some
        200,000 times a planning run, and each cached property read costs about as much as the arithmetic."""
        line, scale = self.prefix_line, self.prefix_new_scale
        c, a, b = self.prefill_fit
        f = self.what_if.prefill_factor  # the served clock against the calibration's
        f = (PREFILL_SUSTAINED_FACTOR.get(gpu_key(self.cal.gpu), 1.0) if f is None else f) * self.served_prefill
        scale = (*scale[:3], math.log(scale[1] / scale[0]), scale[3],  # the fade's span, 0: held past p_at
                 max(0.0, PREFIX_FADE_END - scale[3])) if scale else None
        return (c, a * f, b * f, 2 * self.prefix_factor, (2 * line[0], 2 * line[1], line[2], scale) if line else None,
                self.prefill_floor, self.prefill_ramp)


def nonnegative_fit(x, y) -> tuple[float, ...]:
    """Least squares of `y` (n,) on the columns of `x` (n, k), every coefficient at least 0: the unconstrained fit of
    each subset of the columns, the others 0, the best whose coefficients are all >= 0 (what
    `scipy.optimize.nnls` returns; k is 3 here, so 7 small fits). All 0 when no subset fits."""
    import itertools

    import numpy as np

    best, best_err = np.zeros(x.shape[1]), float(np.sum(y ** 2))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            coef = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
            if (coef < 0).any():
                continue
            err = float(np.sum((x[:, cols] @ coef - y) ** 2))
            if err < best_err - 1e-12:
                best, best_err = np.zeros(x.shape[1]), err
                best[list(cols)] = coef
    return tuple(float(v) for v in best)


#: the clocks `StepModel`s were last given, the first of equal ones (with its `decode_ms` memo) standing for all
_CLOCKS: list[ShardClock] = []


def shared_clock(clock: ShardClock) -> ShardClock:
    """An equal `ShardClock` seen before (same calibration and KV bytes, compared by value), else `clock`: equal
    clocks give equal times, so `StepModel`s share one and its memo."""
    for seen in _CLOCKS:
        if seen == clock:
            return seen
    _CLOCKS.append(clock)
    del _CLOCKS[:-16]
    return clock


@dataclasses.dataclass(frozen=True)
class Replica:
    """One DP replica of a configuration as the simulation runs it: its step times and KV tokens."""

    times: StepTimes
    kv_tokens: int


class StepModel:
    """Predicted forward times of every replica of `config` (see the module docstring for each technique).

    Args:
        config: the configuration.
        shapes: the model's shapes.
        clocks: role -> `ShardClock`: "forward" (every technique but Shift), "shift" and "base" (Shift).
        ic: the interconnect table of the GPU kind.
        elt: bytes per weight and activation element.
        context: the workload's mean context (tokens), at which decisions are made (SiDP's B_th, ZeroDP's offload).
        graph_max_bs: the server's largest decode batch in a CUDA graph (`memory.default_decode_graph_max_bs`); a larger
            batch takes at least the calibrated eager step. None: every batch in a graph.
        decide_ms: from an iteration's start to SGLang's choice of the next (`sim.StepTimes.decide_ms`): the host's
            preparation of a step (`host_time_alone_ms`).
    """

    def __init__(self, config: Configuration, shapes: ModelShapes, clocks: Mapping[str, ShardClock],
                 ic: Interconnect, elt: int = 2, context: int = 1024, graph_max_bs: int | None = None,
                 decide_ms: float = 0.0):
        self.config, self.shapes, self.ic, self.elt = config, shapes, ic, elt
        self.decide_ms = decide_ms
        self.kind = config.kind  # its technique (`technique.Technique`), which composes its forwards
        self.graph_max_bs = graph_max_bs
        self.clocks = {role: shared_clock(clock) for role, clock in clocks.items()}
        self.context = max(1, int(context))
        # role -> the memos of `decode_run` of that role (`_decode_runner`)
        self._decode_memos: dict[str, tuple[dict, dict]] = {}
        # the simulation asks for the same pieces of prefills over and over: each computed once (pure functions of
        # their keys; the streamed bytes of the offload set they were computed for)
        self._collective_memo: dict[tuple, float] = {}
        self._gathered_memo: dict[tuple, tuple[float, float]] = {}
        self._stream_memo: tuple | None = None  # (bytes, decode's slowdown ms, a prefill's slowdown ms, copy_ms)
        # role -> the memos of `prefill_ms` of that role (`_prefill_runner`)
        self._prefill_memos: dict[str, tuple[dict, dict]] = {}
        self._host_memo: dict[float, float] = {}  # b -> the host's work of a decode step (`_host_ms`)
        cal = next(iter(self.clocks.values())).cal
        self.copy_gbps = ic.links["peer_copy"][2].busbw_gbps if "peer_copy" in ic.links else (cal.copy_gbps or 0.0)
        self.copy_rate = cal.copy_rate_in_forward or DEFAULT_COPY_RATE_IN_FORWARD
        slow = cal.copy_slowdown_ms_per_gb
        self.copy_slowdown = DEFAULT_COPY_SLOWDOWN_MS_PER_GB if slow is None else slow
        self.prefill_copy_slowdown = PREFILL_COPY_SLOWDOWN_MS_PER_GB.get(gpu_key(cal.gpu), self.copy_slowdown)

    # ------------------------------------------------------------------ pieces
    @property
    def clock(self) -> ShardClock:
        return self.clocks["forward"]

    def _collective_ms(self, op: str, n: int, tokens: float, per_layer: int = 2, width: int | None = None) -> float:
        """`per_layer` x L calls of `op` over `n` GPUs on a buffer of `tokens` x `width` (default hidden) elements."""
        key = (op, n, tokens, per_layer, width)
        ms = self._collective_memo.get(key)
        if ms is None:
            nbytes = tokens * (width or self.shapes.hidden) * self.elt
            ms = self._collective_memo[key] = per_layer * self.shapes.layers * self.ic.time_us(op, n, nbytes) / 1e3
        return ms

    @functools.cached_property
    def ffn_share(self) -> float:
        """The FFN's share of a dense layer's linear time (its parameters' share: decode linears read their weights)."""
        mlp, attn = self.shapes.dense_mlp_params(), self.shapes.attention_params(1)
        return mlp / (mlp + attn) if mlp else 0.0

    def gathered_ffn_share(self, n: int) -> float:
        """The FFN's share of a DP attention shard's linear work per token (dimensionless): the shard runs the whole
        attention (QKV and O) and 1/n of the FFN, so another rank's token costs it only that 1/n. An MoE layer's FFN
        per token is its top-k routed experts and its shared expert; without `experts_per_token` in the config, the
        dense MLP of `intermediate_size`, and without that `ffn_share` (0). Per-token parameters stand for the work
        (prefill GEMMs are compute-bound).

        Measured on 2 x H100 (Qwen3-30B-A3B, DP attention, 2 x 2,048-token prefills a rank): 88.7 ms an iteration in
        SGLang's log, 101 ms with `ffn_share` (0.67: the dense `intermediate_size` against attention), 94.7 ms with
        this share (0.50)."""
        s = self.shapes
        if s.moe_layers and s.experts_per_token:
            ffn = (s.experts_per_token * s.expert_intermediate + s.shared_intermediate) * 3 * s.hidden / n
        elif s.intermediate:
            ffn = s.dense_mlp_params() / n
        else:
            return self.ffn_share
        return ffn / (ffn + s.attention_params(1))

    def streamed_bytes(self) -> int:
        """Weight bytes a GPU pulls per forward (`Technique.streamed_bytes`: a ZeroDP sink's offloaded experts, a SiDP
        WaS rank's non-owned FFNs; 0 for the others)."""
        return self.kind.streamed_bytes(self)

    def copy_ms(self) -> float:
        """The pulls of one forward at their rate (`Technique.copy_gbps`: the in-forward copy rate, or a ZeroDP
        source's egress shared by its readers)."""
        gbps = self.kind.copy_gbps(self)
        return self.streamed_bytes() / (gbps * 1e9) * 1e3 if gbps > 0 else float("inf")

    def _stream_terms(self, prefill: bool = False) -> tuple[float, float, float]:
        """What pulling `streamed_bytes` during a forward adds (`_terms`' last three): (the copies' slowdown ms, at
        `copy_slowdown` ms per GB in a decode step and `prefill_copy_slowdown` in a prefill forward, 0.0, the copies'
        own ms, which the forward lasts at least: the pulls hide when shorter); (0.0, 0.0, -inf) when nothing is
        pulled. Computed once per set of decisions (`decide` forgets it)."""
        memo = self._stream_memo
        if memo is None:
            nbytes = self.streamed_bytes()
            memo = self._stream_memo = (nbytes, self.copy_slowdown * nbytes / 1e9,
                                        self.prefill_copy_slowdown * nbytes / 1e9, self.copy_ms())
        nbytes, decode_slowdown_ms, prefill_slowdown_ms, copy_ms = memo
        if not nbytes:
            return 0.0, 0.0, -math.inf
        return (prefill_slowdown_ms if prefill else decode_slowdown_ms), 0.0, copy_ms

    # ------------------------------------------------------------------ gathered FFN (DP attention, CaS)
    def _gathered_terms(self, tokens: float, n: int, share: float | None = None) -> tuple[float, float]:
        """What a forward whose FFN runs on the tokens of `n` ranks adds (ms): (the FFN's share of the linear time of
        n x `tokens` less `tokens`, per layer an all-gather and a reduce-scatter of n x `tokens`). `share`: that
        share (default `ffn_share`; DP attention's shard: `gathered_ffn_share`)."""
        share = self.ffn_share if share is None else share
        key = (tokens, n, share)
        extra_comm = self._gathered_memo.get(key)
        if extra_comm is None:
            extra = share * self.clock.more_tokens_ms(tokens, n)
            comm = (self._collective_ms("all_gather", n, n * tokens, 1)
                    + self._collective_ms("reduce_scatter", n, n * tokens, 1))
            extra_comm = self._gathered_memo[key] = (extra, comm)
        return extra_comm

    # ------------------------------------------------------------------ the technique's decisions
    def decided(self, key: str, compute: Callable[[], object]):
        """The technique's decision `key` (SiDP's "b_th", Shift's "shift_threshold"), `compute()` the first time. Kept
        as the model's attribute `key`, as a cached property would be (`__getattr__` asks the technique only before)."""
        d = self.__dict__
        if key not in d:
            d[key] = compute()
        return d[key]

    def decision(self, key: str, default=None):
        """The technique's decision `key` as made (`decided`, `decide`), else `default`."""
        return self.__dict__.get(key, default)

    def decide(self, key: str, value):
        """Sets the technique's decision `key` (ZeroDP's "offload_layers") to `value` and forgets the forwards computed
        before, with another; returns `value`."""
        self.__dict__[key] = value
        self._decode_memos.clear()
        self._prefill_memos.clear()
        self._stream_memo = None
        return value

    def __getattr__(self, name: str):
        """A technique's own attribute of its model (`Technique.model_attributes`: SiDP's `b_th`, Shift's
        `shift_threshold`, ZeroDP's `offload_layers` and `choose_offload`)."""
        if name.startswith("_") or name in ("config", "kind"):
            raise AttributeError(name)
        get = self.kind.model_attributes.get(name)
        if get is None:
            raise AttributeError(f"{type(self).__name__} of {self.config.technique} has no attribute {name!r}")
        return get(self)

    # ------------------------------------------------------------------ a forward: one shard's, plus terms of its size
    # Every technique's forward is one shard's (`ShardClock.decode_ms`, `prefill_ms`) plus what the technique adds to
    # it, which depends on the forward's size alone (decode rows or prefill tokens): collectives, the weights it pulls,
    # the FFN it runs for other ranks. `_terms` gives them as (shard, SP, add1, add2, add3, at_least): the forward
    # lasts the shard's + add1 + add2 + add3, at least at_least (`_decode_with`, `_prefill_with`), the additions in
    # the order each technique makes them, so the floats are those of its formula; a term a technique lacks is 0.0
    # (x + 0.0 is x for every x but -0.0, and times are positive) or an at_least of -inf. The simulation asks for
    # some 400,000 forwards a planning run that no memo of whole forwards holds (new contexts, batches of several
    # prompts): with each size's terms computed once, each of them is the shard's forward and five operations.
    def _terms(self, size: float, role: str = "", variant: str | None = None, prefill: bool = False) -> tuple:
        """A forward of `size` (decode rows or prefill tokens, `prefill`) of a replica in `role` ("sink" for a ZeroDP
        sink) as (shard, SP, add1, add2, add3, at_least) (see above; SP > 1: the shard runs `size` / SP, Shift's
        base), SiDP as `variant` (default: the configuration's)."""
        return self.kind.terms(self, size, role, variant, prefill)

    @staticmethod
    def _decode_with(terms: tuple, b: float, ctx: float) -> float:
        """The GPU's decode step of `b` rows of `ctx` tokens with `_terms(b)`."""
        shard, sp, add1, add2, add3, at_least = terms
        ms = shard.decode_ms(b if sp == 1 else b / sp, ctx) + add1 + add2 + add3
        return at_least if at_least > ms else ms  # max(ms, at_least)

    @staticmethod
    def _prefill_with(terms: tuple, parts) -> float:
        """A prefill forward of `parts` ((new tokens, tokens in KV) per request) with `_terms` of its new tokens."""
        shard, sp, add1, add2, add3, at_least = terms
        ms = shard.prefill_ms(parts, 1.0 if sp == 1 else 1 / sp) + add1 + add2 + add3
        return at_least if at_least > ms else ms

    # ------------------------------------------------------------------ per technique
    def decode_ms(self, b: float, ctx: float, role: str = "") -> float:
        """A decode step of `b` sequences of `ctx` tokens on one replica (`role` "sink" for a ZeroDP sink), the
        context rounded to `CONTEXT_STEP` tokens and each (role, b, context) computed once: a simulation asks for
        millions of steps whose context grows by one token at a time (the rounding moves a step by a fraction of a
        percent: a step's context cost per token is b x a few ns)."""
        return self.decode_run(b, ctx, role)[0]

    def decode_run(self, b: int, ctx: float, role: str = "") -> tuple[float, int]:
        """(`decode_ms(b, ctx, role)`, steps): and for how many decode steps, the context growing by one token a step
        (ctx, ctx + 1, ...), it stays the same: the contexts that round to the same multiple of `CONTEXT_STEP`
        (`sim.StepTimes.decode_run`).

        round() goes to even on a tie, so from q = round(ctx / CONTEXT_STEP) it moves on at the first context past
        h = CONTEXT_STEP x (q + 1/2), or at h itself when q is odd. The simulation's contexts are means of whole
        tokens over the batch (S / b): h - ctx is a whole number only when the mean is one (exact in floats), and is
        otherwise at least 1 / b away from one, far more than the floats' error, so floor and ceil are exact."""
        return self._decode_runner(role)(b, ctx)

    def _decode_runner(self, role: str) -> Callable[[int, float], tuple[float, int]]:
        """`decode_run` of `role` as a function of (b, ctx), each (b, rounded context) computed once: a closure over
        its memos, b -> {q = round(ctx / CONTEXT_STEP): (ms, h, q odd)} and b -> the batch's terms (`_terms`, the
        shard's batch and the host's step). The simulation calls it for every run of equal decode steps, half a
        million times in a planning run: the closure's locals take some 15 % off the partial of a method over one
        memo keyed by (role, b, q) it replaces, and a memo per batch (its runs follow one another in q) some 10 % off
        one keyed by (b, q) pairs. A new closure each call, over memos the model keeps: the model keeps no closure,
        so no reference cycle holds it (and its memos) for the cyclic garbage collector."""
        by_batch, batch_terms = self._decode_memos.setdefault(role, (collections.defaultdict(dict), {}))
        step, half, ceil, floor = CONTEXT_STEP, CONTEXT_STEP / 2, math.ceil, math.floor
        round_float = float.__round__  # round() of a float, without the builtin's lookup of it (3x faster)

        def run(b: int, ctx: float) -> tuple[float, int]:
            q = round_float(ctx / step)
            memo = by_batch[b]
            hit = memo.get(q)
            if hit is None:  # `_decode_uncached(b, step * q, role)`, the batch's terms computed once
                terms = batch_terms.get(b)
                if terms is None:
                    shard, sp, add1, add2, add3, at_least = self._terms(b, role)
                    terms = batch_terms[b] = (shard.decode_ms, b if sp == 1 else b / sp, add1, add2, add3, at_least,
                                              self._host_ms(b))
                decode, rows, add1, add2, add3, at_least, host = terms
                ms = decode(rows, step * q) + add1 + add2 + add3
                ms = at_least if at_least > ms else ms
                hit = memo[q] = (host if host > ms else ms, step * q + half, q % 2)
            ms, h, odd = hit  # ctx <= h (< h when q is odd): steps >= 1
            return ms, ceil(h - ctx) if odd else floor(h - ctx) + 1

        return run

    def _decode_uncached(self, b: float, ctx: int, role: str) -> float:
        """The GPU's step (`_terms`) or the host's, whichever is longer: the host runs the scheduler's work for `b`
        requests (`ShardClock.host_ms`), which the overlap scheduler hides behind a graph forward, and past the
        largest decode graph (SGLang runs the batch eagerly) the forward's kernel launches too, at least the
        calibrated eager step (`ShardClock.eager_ms`). (`_decode_runner` computes it so, each batch's terms once.)"""
        ms = self._decode_with(self._terms(b, role), b, ctx)
        host = self._host_ms(b)
        return host if host > ms else ms  # max(ms, host)

    def _host_ms(self, b: float) -> float:
        """The host's work of a decode step of `b` running requests (`_decode_uncached`), computed once per batch."""
        host = self._host_memo.get(b)
        if host is None:
            clock = self.clocks[self.kind.host_role]
            host = clock.host_ms(b)
            if self.graph_max_bs is not None and b > self.graph_max_bs:
                host += clock.eager_ms(b)
            self._host_memo[b] = host
        return host

    def prefill_ms(self, parts, role: str = "") -> float:
        """One prefill forward of `parts` ((new tokens, tokens in KV) per request) on one replica (a one-request
        prefill computed once: a simulation asks for the same chunks of long prompts many times)."""
        return self._prefill_runner(role)(parts)

    def _prefill_runner(self, role: str) -> Callable[[Sequence[tuple[int, int]]], float]:
        """`prefill_ms` of `role` as a function of `parts`, a one-request prefill computed once: a closure over its
        memos, (new, prefix) -> ms and new tokens -> their terms (`_terms`), as `_decode_runner` (the simulation
        calls it for every prefill, some 275,000 times in a planning run)."""
        memo, new_terms = self._prefill_memos.setdefault(role, ({}, {}))

        def run(parts) -> float:
            if len(parts) == 1:
                part = parts[0]
                ms = memo.get(part)
                if ms is not None:
                    return ms
                new = part[0]
            else:
                new = 0
                for n, _ in parts:
                    new += n
            terms = new_terms.get(new)  # `_prefill_with(self._terms(new, role, prefill=True), parts)`, computed once
            if terms is None:
                shard, sp, add1, add2, add3, at_least = self._terms(new, role, prefill=True)
                terms = new_terms[new] = (shard.prefill_ms, 1.0 if sp == 1 else 1 / sp, add1, add2, add3, at_least)
            prefill, share, add1, add2, add3, at_least = terms
            ms = prefill(parts, share) + add1 + add2 + add3
            ms = at_least if at_least > ms else ms
            if len(parts) == 1:
                memo[part] = ms
            return ms

        return run

    def step_times(self, role: str = "") -> StepTimes:
        """The simulation's step times of a replica in `role` ("sink" for a ZeroDP sink, else ""): a decode step at
        least its longest row's (`sim.StepTimes.longest_row`)."""
        # the simulation's calls go straight to the closures over the memos (`_decode_runner`, `_prefill_runner`)
        share, min_ms = self.kind.release(self.config, self.shapes.layers)
        return StepTimes(lambda b, ctx: self.decode_ms(b, ctx, role), self._prefill_runner(role),
                         self._decode_runner(role), longest_row=True, decide_ms=self.decide_ms,
                         release_share=share, release_min_ms=min_ms)

    def replicas(self, kv: Mapping[str, int]) -> list[Replica]:
        """The simulation's replicas: `kv` is `Configuration.kv_tokens` (by role) of this configuration."""
        return self.kind.replicas(self, kv)

    def steps_variant(self) -> str:
        """The variant whose step times this configuration's equal: SiDP auto with its B_th at most one token steps as
        WaS at every batch and prefill, with B_th inf as CaS; else its own (`config.variant`)."""
        return self.kind.steps_variant(self)

    def decisions(self) -> dict:
        """What the technique decides from this cost model (for the table and the launch command)."""
        return self.kind.decisions(self)

    def graphs_past_calibration(self) -> str | None:
        """Where the server's decode graphs run batches larger than a shard's calibration timed, as one phrase ("decode
        steps of 257-512 rows in CUDA graphs ..."); None where every role's table reaches `graph_max_bs`. Such steps
        are priced along the slope of the table's two largest batches (`ShardClock.decode_ms`): on H200, before the
        tables took 384 and 512 rows, that slope priced the dense shards' 512-row steps 5-12 % low
        (`benchmarks/results/plan_multi_gpu/h200/calibrate_512/`)."""
        if not self.graph_max_bs:
            return None
        short = {role: clock.cal.decode_batches[-1] for role, clock in self.clocks.items()
                 if clock.cal.decode_batches[-1] < self.graph_max_bs}
        if not short:
            return None
        tables = ", ".join(f"{role}'s table ends at {rows}" for role, rows in short.items())
        return (f"decode steps of {min(short.values()) + 1}-{self.graph_max_bs} rows in CUDA graphs priced along the "
                f"slope of the calibration's two largest batches ({tables})")


def shard_roles(config: Configuration, shapes: ModelShapes) -> dict[str, Shard]:
    """The shards whose calibrations `StepModel` needs: role -> shard."""
    return dict(config.shards(shapes))
