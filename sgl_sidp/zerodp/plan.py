"""ZeroDP's pure logic: expert manifests, the offload policy, the prefetch schedule.

Nothing here touches a GPU, so all of it is tested on CPU (`tests/test_zerodp_plan.py`). The
mechanisms it drives live below: `sgl_sidp.peer` (sharing the source's memory) and
`sgl_sidp.prefetch` (the slot ring a sink pulls into).

Terms:
- *source*: the DP replica (DP rank 0) that keeps every expert weight and runs as vanilla SGLang.
- *sink*: any other DP replica; it keeps attention, norms, router and embeddings, and for the
  *offloaded* MoE layers pulls the expert tensors from the source's HBM into one of two *slots*
  (double buffer) just before that layer's experts run (`sgl_sidp.prefetch.ring.PrefetchSchedule`).
- *group*: the expert tensors that travel together: "w13" (`w13_weight` and, for quantized
  models, its scales) and "w2" (`w2_weight` and its scales). Names follow SGLang's
  `sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE` parameters.

The policy (ZeroDP blog, Doubleword; issue 3): offload the largest set of experts whose copy
time fits under the forward time of the expected batch, spread evenly over the layers so each
copy hides behind the compute that precedes its layer. The default expected batch, "decode:1",
keeps a sink as fast as vanilla at any load (on H200 with Qwen3-30B-A3B it offloads nothing).
With "kv:C" (saturated serving) the expected batch is not fixed: it is as many C-token sequences
as the sink's KV cache holds, which grows with every offloaded layer, and the policy keeps the set
that maximizes modeled decode tokens/s, counting the HBM time the copies steal (`KVModel`,
`choose_plan`). Why the default is so cautious: benchmarks/results/zerodp/README.md, round 2.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from sgl_sidp.peer.manifest import TensorSpec

#: Expert tensor groups, in the order a layer's experts use them (gate/up, then down).
GROUPS = ("w13", "w2")

#: Fraction of the forward time the copies may fill. The rest absorbs jitter and the
#: copy engine's share of the sink's HBM bandwidth.
COPY_BUDGET_MARGIN = 0.85

#: Slots a sink pulls into (double buffer). They cost `N_SLOTS` layers of memory, so offloading
#: `N_SLOTS` layers or fewer frees no KV at all and the policy offloads none instead.
N_SLOTS = 2

#: With "kv:C", the modeled decode tokens/s must beat offloading nothing by this factor. On H200 the
#: model over-predicted the measured steady-state gain of 8 offloaded layers by about 1.1x
#: (benchmarks/results/zerodp/r80_kv): smaller predicted gains are inside its error.
KV_MIN_GAIN = 1.10

CALIBRATION_DIR = Path(__file__).with_name("calibration")


class ZeroDPError(RuntimeError):
    """ZeroDP cannot run as configured (bad model, bad pairing, lost source...)."""


def group_of(param_name: str) -> str | None:
    """The group ("w13" or "w2") an `FusedMoE` parameter belongs to, or None for a resident one.

    >>> group_of("w13_weight"), group_of("w2_weight_scale_inv"), group_of("e_score_correction_bias")
    ('w13', 'w2', None)
    """
    for g in GROUPS:
        if param_name.startswith(g + "_"):
            return g
    return None


def manifest_of(moe_layers: Iterable[tuple[int, object]]) -> list[TensorSpec]:
    """Describe the offloadable parameters of `(layer_id, FusedMoE)` pairs (works on CPU modules).

    Only the module's own parameters in a group ("w13_*", "w2_*") are listed.
    """
    out = []
    for layer_id, module in moe_layers:
        for name, p in module.named_parameters(recurse=False):
            if group_of(name) is None:
                continue
            out.append(TensorSpec(int(layer_id), name, tuple(p.shape), str(p.dtype), p.numel() * p.element_size()))
    return sorted(out, key=lambda t: t.key)


# --------------------------------------------------------------------------- calibration
@dataclasses.dataclass(frozen=True)
class Calibration:
    """Forward times the policy fits the copies under (from `scripts/zerodp_fetch_vs_compute.py`).

    Attributes:
        model: what the numbers were measured on, e.g. "Qwen3MoeForCausalLM L48 E128 H2048 I768 tp1".
        gpu: GPU name, e.g. "NVIDIA H200".
        decode_ms: vanilla forward time (ms) of a decode step, by batch size.
        prefill_ms: vanilla forward time (ms) of a prefill forward, by tokens in the forward.
        copy_gbps: peer-copy rate (GB/s, 1e9 bytes) measured with the same run; informative, the
            sink re-measures it at start-up.
        source: where the numbers come from (command and date).
        decode_context: tokens per sequence (prompt + generated) of each `decode_ms` point; missing
            points count as 0 (no context correction).
        attention_gbps: rate (GB/s) at which a decode step reads its KV cache; `decode_step_ms` adds
            the time of the context beyond a point's own. None: no correction.
        copy_slowdown_ms_per_gb: how much a decode step slows (ms) per GB the sink pulls during it
            (the copies' HBM writes and copy-engine traffic), measured side by side. 0: not priced.
        copy_rate_in_forward: fraction of the sink's start-up copy rate its copies reach inside
            busy decode forwards (measured: a copy-bound sink step against the bytes it pulled).
    """

    model: str
    gpu: str
    decode_ms: dict[int, float]
    prefill_ms: dict[int, float]
    copy_gbps: float
    source: str
    decode_context: dict[int, int] = dataclasses.field(default_factory=dict)
    attention_gbps: float | None = None
    copy_slowdown_ms_per_gb: float = 0.0
    copy_rate_in_forward: float = 1.0

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        d = json.loads(Path(path).read_text())
        return cls(
            model=d["model"],
            gpu=d["gpu"],
            decode_ms={int(k): float(v) for k, v in d["decode_ms"].items()},
            prefill_ms={int(k): float(v) for k, v in d["prefill_ms"].items()},
            copy_gbps=float(d["copy_gbps"]),
            source=d.get("source", ""),
            decode_context={int(k): int(v) for k, v in d.get("decode_context", {}).items()},
            attention_gbps=float(d["attention_gbps"]) if d.get("attention_gbps") else None,
            copy_slowdown_ms_per_gb=float(d.get("copy_slowdown_ms_per_gb", 0.0)),
            copy_rate_in_forward=float(d.get("copy_rate_in_forward", 1.0)),
        )

    def forward_ms(self, expected: "ExpectedBatch") -> float:
        """Forward time of a fixed `expected` batch ("decode:N" or "prefill:T"), interpolated linearly
        between measured points (clamped at the ends)."""
        if expected.kind not in ("decode", "prefill"):
            raise ValueError(f"forward_ms takes a fixed batch (decode:N or prefill:T), not {expected}")
        table = self.decode_ms if expected.kind == "decode" else self.prefill_ms
        if not table:
            raise ZeroDPError(f"calibration for {self.model} has no {expected.kind} times")
        xs = sorted(table)
        return float(np.interp(expected.size, xs, [table[x] for x in xs]))

    def decode_step_ms(self, batch: float, context: int, kv_bytes_per_token: int) -> float:
        """Modeled vanilla decode step (ms) of `batch` sequences of `context` tokens each.

        The measured time at `batch` (interpolated) plus the extra KV reads of the context beyond
        the measured points' own, at `attention_gbps` (nothing is subtracted for shorter contexts).
        """
        if not self.decode_ms:
            raise ZeroDPError(f"calibration for {self.model} has no decode times")
        xs = sorted(self.decode_ms)
        ms = float(np.interp(batch, xs, [self.decode_ms[x] for x in xs]))
        if self.attention_gbps:
            measured_ctx = float(np.interp(batch, xs, [self.decode_context.get(x, 0) for x in xs]))
            extra_bytes = batch * max(0.0, context - measured_ctx) * kv_bytes_per_token
            ms += extra_bytes / (self.attention_gbps * 1e9) * 1e3
        return ms


def model_signature(hf_config: Mapping, tp_size: int) -> str:
    """Key a calibration file is matched on: architecture and the sizes that set expert bytes and FLOPs."""
    cfg = hf_config.get("text_config", hf_config)
    arch = (cfg.get("architectures") or ["?"])[0]
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    inter = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    return f"{arch} L{cfg.get('num_hidden_layers')} E{experts} H{cfg.get('hidden_size')} I{inter} tp{tp_size}"


def find_calibration(signature: str, gpu_name: str | None, directory: Path = CALIBRATION_DIR) -> Path | None:
    """The bundled calibration file for this model signature and GPU (any GPU if None), or None."""
    for f in sorted(directory.glob("*.json")):
        d = json.loads(f.read_text())
        if d.get("model") == signature and (gpu_name is None or d.get("gpu", "").lower() in gpu_name.lower()):
            return f
    return None


def auto_policy_problems(model_path: str, tp_size: int, calibration: str | None) -> list[str]:
    """Launcher check for `--sidp-zerodp-layers auto`: is there a calibration to size the offload with?

    Reads only files (no GPU). A model given as a hub id (no local config.json) is left to the
    sink, which also matches the GPU name.
    """
    if calibration is not None:
        try:
            Calibration.load(calibration)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same problem for the user
            return [f"--sidp-zerodp-calibration {calibration}: cannot read it ({type(e).__name__}: {e})"]
        return []
    cfg_file = Path(model_path) / "config.json"
    if not cfg_file.is_file():
        return []
    sig = model_signature(json.loads(cfg_file.read_text()), tp_size)
    if find_calibration(sig, None) is None:
        return [
            f"--sidp-zerodp-layers auto needs forward times for '{sig}' and none is bundled: run "
            "scripts/zerodp_fetch_vs_compute.py and pass --sidp-zerodp-calibration, or force the set with "
            "--sidp-zerodp-layers all|every:K|3,7,11"
        ]
    return []


@dataclasses.dataclass(frozen=True)
class ExpectedBatch:
    """The batch the policy sizes the offload for.

    "decode:64": decode steps of 64 sequences; "prefill:8192": forwards of 8,192 tokens;
    "kv:2048": decode steps of as many 2,048-token sequences as the sink's KV cache holds (the
    capacity-bound regime ZeroDP exists for; the batch grows with the offload, see `KVModel`).
    """

    kind: str
    size: int

    KINDS = ("decode", "prefill", "kv")

    @classmethod
    def parse(cls, text: str) -> "ExpectedBatch":
        kind, _, size = text.partition(":")
        if kind not in cls.KINDS or not size.isdigit() or int(size) < 1:
            raise ValueError(f"expected 'decode:N', 'prefill:N' or 'kv:N' with N >= 1, got {text!r}")
        return cls(kind, int(size))

    def __str__(self) -> str:
        return f"{self.kind}:{self.size}"


@dataclasses.dataclass(frozen=True)
class KVModel:
    """Capacity-bound decode on a sink, the model behind "kv:C" (`choose_plan`).

    A replica that serves more sequences than its KV cache holds runs decode steps of
    `batch = KV bytes / (context * kv_bytes_per_token)` sequences. Offloading n layers adds
    `n * layer_bytes - slots` bytes of KV (the two slots cost two layers), so the batch grows; the
    step takes the longer of the modeled forward (`Calibration.decode_step_ms`, plus the
    copies' measured slowdown) and the copies themselves (at `copy_rate_in_forward` of the
    start-up rate).

    Attributes:
        vanilla_kv_bytes: bytes SGLang gives the KV cache without ZeroDP (free memory after the
            weights load, less SGLang's slack for `--mem-fraction-static`).
        kv_bytes_per_token: KV bytes of one token over all layers of this TP rank.
        context: tokens per running sequence (the "C" of "kv:C").
        calibration: forward times and the copies' slowdown.
        max_batch: cap on running sequences (`--max-running-requests`), None: no cap.
    """

    vanilla_kv_bytes: float
    kv_bytes_per_token: int
    context: int
    calibration: Calibration
    max_batch: int | None = None

    def batch(self, extra_kv_bytes: float) -> float:
        """Sequences of `context` tokens the KV cache holds with `extra_kv_bytes` more (>= 1)."""
        b = (self.vanilla_kv_bytes + extra_kv_bytes) / (self.context * self.kv_bytes_per_token)
        if self.max_batch:
            b = min(b, self.max_batch)
        return max(1.0, b)

    def tokens_per_s(self, n_layers: int, layer_bytes: int, copy_gbps: float) -> tuple[float, float, float]:
        """(batch, step ms, decode tokens/s) of a sink offloading `n_layers` of `layer_bytes` each."""
        extra = n_layers * layer_bytes - min(n_layers, N_SLOTS) * layer_bytes
        b = self.batch(extra)
        pulled_gb = n_layers * layer_bytes / 1e9
        compute = self.calibration.decode_step_ms(b, self.context, self.kv_bytes_per_token)
        compute += self.calibration.copy_slowdown_ms_per_gb * pulled_gb
        copies = pulled_gb / (copy_gbps * self.calibration.copy_rate_in_forward) * 1e3
        step = max(compute, copies)
        return b, step, b / step * 1e3


# --------------------------------------------------------------------------- policy
@dataclasses.dataclass(frozen=True)
class OffloadPlan:
    """What one sink pulls from its source on every forward.

    Attributes:
        layers: offloaded MoE layer ids, in forward order.
        groups: offloaded groups, e.g. ("w13", "w2").
        bytes_per_forward: bytes pulled per forward (sum over `layers` and `groups`).
        copy_ms: time those bytes take at the measured copy rate (ms).
        budget_ms: the forward time they were fitted under (ms); 0 when the layers were forced.
        reason: one line saying why this set was chosen.
    """

    layers: tuple[int, ...]
    groups: tuple[str, ...]
    bytes_per_forward: int
    copy_ms: float
    budget_ms: float
    reason: str


def spread(candidates: Sequence[int], n: int, phase: float = 0.0) -> tuple[int, ...]:
    """Pick `n` of `candidates` (in order) evenly spaced, the last one included at phase 0.

    Spacing keeps one copy in flight per stretch of compute; ending at the last layer keeps the
    first layer resident, since nothing runs before it to hide its copy. `phase` in [0, 1) shifts
    the picks by that fraction of the spacing (earlier), so sinks of one source pull different
    layers at the same point of their forwards.
    """
    L = len(candidates)
    if n <= 0:
        return ()
    if n >= L:
        return tuple(candidates)
    stride = L / n
    picks = []
    for i in range(n):
        idx = math.ceil((i + 1) * stride - 1 - phase * stride - 1e-9)
        picks.append(candidates[max(0, min(L - 1, idx))])
    return tuple(sorted(set(picks)))


def parse_layers(spec: str, moe_layers: Sequence[int]) -> tuple[int, ...] | None:
    """Layers forced by `--sidp-zerodp-layers`: "auto" -> None, "all", "every:K" or "3,7,11".

    Raises:
        ValueError: an unknown form or a layer that is not an MoE layer.
    """
    if spec == "auto":
        return None
    if spec == "all":
        return tuple(moe_layers)
    if spec.startswith("every:"):
        k = spec.split(":", 1)[1]
        if not k.isdigit() or int(k) < 1:
            raise ValueError(f"--sidp-zerodp-layers every:K needs K >= 1, got {spec!r}")
        k = int(k)
        return tuple(moe_layers[i] for i in range(len(moe_layers)) if (i + 1) % k == 0)
    try:
        layers = tuple(sorted({int(x) for x in spec.split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"--sidp-zerodp-layers takes auto, all, every:K or a comma list of layer ids, got {spec!r}") from None
    bad = [x for x in layers if x not in set(moe_layers)]
    if bad:
        raise ValueError(f"--sidp-zerodp-layers names layers without MoE experts: {bad}")
    return layers


def choose_plan(
    manifest: Sequence[TensorSpec],
    groups: Sequence[str],
    copy_gbps: float,
    budget_ms: float | None,
    forced_layers: Sequence[int] | None = None,
    sink_index: int = 0,
    n_sinks: int = 1,
    kv: KVModel | None = None,
) -> OffloadPlan:
    """The offload set of one sink.

    Args:
        manifest: the expert tensors of every MoE layer (`manifest_of`).
        groups: which groups may be offloaded, a subset of `GROUPS`.
        copy_gbps: measured peer-copy rate, GB/s (1e9 bytes/s), > 0.
        budget_ms: forward time of a fixed expected batch (ms): offload the most layers whose
            copies fit in `COPY_BUDGET_MARGIN` of it. None with `forced_layers` or `kv`.
        forced_layers: offload exactly these layers (flag override) instead of fitting.
        kv: capacity-bound model ("kv:C"): offload the count n that maximizes the modeled decode
            tokens/s (`KVModel.tokens_per_s`; ties go to the smaller n), and none unless that beats
            offloading nothing by `KV_MIN_GAIN`. A fixed budget that holds `N_SLOTS` layers or
            fewer offloads none (the slots would cost what the layers free).
        sink_index, n_sinks: this sink's 0-based index among the source's sinks; shifts the
            picked layers by `sink_index / n_sinks` of the spacing (staggered orders).

    Raises:
        ValueError: unknown group, no budget and no forced layers, non-positive rate.
    """
    bad = [g for g in groups if g not in GROUPS]
    if bad or not groups:
        raise ValueError(f"--sidp-zerodp-tensors must name groups among {GROUPS}, got {list(groups)}")
    if copy_gbps <= 0:
        raise ValueError(f"copy rate must be > 0 GB/s, got {copy_gbps}")
    moe_layers = sorted({t.layer_id for t in manifest})
    per_layer: dict[int, int] = {lid: 0 for lid in moe_layers}
    for t in manifest:
        if group_of(t.name) in groups:
            per_layer[t.layer_id] += t.nbytes
    layer_ms = {lid: b / copy_gbps / 1e6 for lid, b in per_layer.items()}
    groups_t = tuple(g for g in GROUPS if g in groups)

    phase = (sink_index % max(1, n_sinks)) / max(1, n_sinks)
    one = max(layer_ms.values()) if layer_ms else math.inf
    if forced_layers is not None:
        layers = tuple(sorted(forced_layers))
        reason = f"forced by --sidp-zerodp-layers ({len(layers)} of {len(moe_layers)} MoE layers)"
        budget = 0.0
    elif kv is not None:
        layer_bytes = max(per_layer.values()) if per_layer else 0
        rows = [kv.tokens_per_s(n, layer_bytes, copy_gbps) for n in range(len(moe_layers) + 1)]
        n = max(range(len(rows)), key=lambda i: (rows[i][2], -i))
        if rows[n][2] < KV_MIN_GAIN * rows[0][2]:
            n = 0
        b, budget, tps = rows[n]
        b0, step0, tps0 = rows[0]
        layers = spread(moe_layers, n, phase)
        reason = (
            f"{n} of {len(moe_layers)} MoE layers: decode of {kv.context}-token sequences as the KV cache holds "
            f"them, batch {b:.0f} in a {budget:.1f} ms step = {tps:,.0f} tok/s (nothing offloaded: batch {b0:.0f} "
            f"in {step0:.1f} ms = {tps0:,.0f} tok/s; {one:.2f} ms per layer at {copy_gbps:.0f} GB/s)"
        )
    else:
        if budget_ms is None:
            raise ValueError("choose_plan needs budget_ms or kv unless forced_layers is given")
        budget = float(budget_ms)
        fit = COPY_BUDGET_MARGIN * budget
        fits = min(len(moe_layers), int(fit // one)) if one > 0 else len(moe_layers)
        n = fits if fits > N_SLOTS else 0
        layers = spread(moe_layers, n, phase)
        reason = (
            f"{n} of {len(moe_layers)} MoE layers: {one:.2f} ms per layer at {copy_gbps:.0f} GB/s, "
            f"{COPY_BUDGET_MARGIN:.0%} of a {budget:.1f} ms forward = {fit:.1f} ms of copies"
            + (f" ({fits} would fit, but {N_SLOTS} slots cost as much as they free)" if fits and not n else "")
        )
    nbytes = sum(per_layer[lid] for lid in layers)
    return OffloadPlan(layers, groups_t, nbytes, nbytes / copy_gbps / 1e6, budget, reason)


def hidden_fraction(copy_ms: float, forward_ms: float) -> float:
    """Fraction of the copy time that can hide behind a forward of `forward_ms` (1.0 = all)."""
    if copy_ms <= 0:
        return 1.0
    return min(1.0, forward_ms / copy_ms)


def source_sink_pairs(dp_size: int, tp_size: int, base_gpu_id: int = 0, gpu_id_step: int = 1) -> list[tuple[int, int]]:
    """(source GPU, sink GPU) for every sink TP rank: sink TP rank k reads source TP rank k."""
    from sgl_sidp.peer.topology import replica_gpus

    gpus = replica_gpus(dp_size, tp_size, base_gpu_id, gpu_id_step)
    return [(gpus[0][t], gpus[d][t]) for d in range(1, dp_size) for t in range(tp_size)]
