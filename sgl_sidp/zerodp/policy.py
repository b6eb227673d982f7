"""ZeroDP's policy: expert manifests, the offload set of each sink, source/sink GPU pairs.

Nothing here touches a GPU, so all of it is tested on CPU (`tests/test_zerodp_policy.py`). The
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
from typing import Iterable, Sequence

from sgl_sidp.calibration.cost import COPY_BUDGET_MARGIN, KVModel, best_offload_count, copies_that_fit, spread
from sgl_sidp.peer.manifest import TensorSpec

#: Expert tensor groups, in the order a layer's experts use them (gate/up, then down).
GROUPS = ("w13", "w2")

#: Slots a sink pulls into (double buffer). They cost `N_SLOTS` layers of memory, so offloading
#: `N_SLOTS` layers or fewer frees no KV at all and the policy offloads none instead.
N_SLOTS = 2

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


def parse_layers(spec: str, moe_layers: Sequence[int]) -> tuple[int, ...] | None:
    """Layers forced by `--zerodp-layers`: "auto" -> None, "all", "every:K" or "3,7,11".

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
            raise ValueError(f"--zerodp-layers every:K needs K >= 1, got {spec!r}")
        k = int(k)
        return tuple(moe_layers[i] for i in range(len(moe_layers)) if (i + 1) % k == 0)
    try:
        layers = tuple(sorted({int(x) for x in spec.split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"--zerodp-layers takes auto, all, every:K or a comma list of layer ids, got {spec!r}") from None
    bad = [x for x in layers if x not in set(moe_layers)]
    if bad:
        raise ValueError(f"--zerodp-layers names layers without MoE experts: {bad}")
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
    rate_in_forward: float = 1.0,
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
            offloading nothing by `cost.KV_MIN_GAIN`. A fixed budget that holds `N_SLOTS` layers or
            fewer offloads none (the slots would cost what the layers free).
        sink_index, n_sinks: this sink's 0-based index among the source's sinks; shifts the
            picked layers by `sink_index / n_sinks` of the spacing (staggered orders).
        rate_in_forward: fraction of `copy_gbps` that copies reach while forwards run (`Calibration.
            copy_rate_in_forward`, measured on the real pair; 0.71 on 2 x H100, 0.80 on H200): a fixed budget fits
            the copies at that rate, since they run beside the forward that hides them.

    Raises:
        ValueError: unknown group, no budget and no forced layers, non-positive rate.
    """
    bad = [g for g in groups if g not in GROUPS]
    if bad or not groups:
        raise ValueError(f"--zerodp-tensors must name groups among {GROUPS}, got {list(groups)}")
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
    one = max(layer_ms.values()) if layer_ms else float("inf")
    if forced_layers is not None:
        layers = tuple(sorted(forced_layers))
        reason = f"forced by --zerodp-layers ({len(layers)} of {len(moe_layers)} MoE layers)"
        budget = 0.0
    elif kv is not None:
        layer_bytes = max(per_layer.values()) if per_layer else 0
        n, rows = best_offload_count(kv, len(moe_layers), layer_bytes, copy_gbps)
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
        if not 0 < rate_in_forward <= 1:
            raise ValueError(f"copy rate in forwards must be in (0, 1] of the idle rate, got {rate_in_forward}")
        budget = float(budget_ms)
        fit = COPY_BUDGET_MARGIN * budget
        beside = one / rate_in_forward
        fits = min(len(moe_layers), copies_that_fit(beside, budget))
        n = fits if fits > N_SLOTS else 0
        layers = spread(moe_layers, n, phase)
        reason = (
            f"{n} of {len(moe_layers)} MoE layers: {one:.2f} ms per layer at {copy_gbps:.0f} GB/s"
            + (f" ({beside:.2f} ms beside compute, at {rate_in_forward:.0%} of that rate)" if rate_in_forward < 1 else "")
            + f", {COPY_BUDGET_MARGIN:.0%} of a {budget:.1f} ms forward = {fit:.1f} ms of copies"
            + (f" ({fits} would fit, but {N_SLOTS} slots cost as much as they free)" if fits and not n else "")
        )
    nbytes = sum(per_layer[lid] for lid in layers)
    return OffloadPlan(layers, groups_t, nbytes, nbytes / copy_gbps / 1e6, budget, reason)


def source_sink_pairs(dp_size: int, tp_size: int, base_gpu_id: int = 0, gpu_id_step: int = 1) -> list[tuple[int, int]]:
    """(source GPU, sink GPU) for every sink TP rank: sink TP rank k reads source TP rank k."""
    from sgl_sidp.peer.topology import replica_gpus

    gpus = replica_gpus(dp_size, tp_size, base_gpu_id, gpu_id_step)
    return [(gpus[0][t], gpus[d][t]) for d in range(1, dp_size) for t in range(tp_size)]
