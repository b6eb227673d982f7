"""What the planner asks of a technique: one `Technique` object per way of running a model, so that `configs`, `steps`
and `planner` never branch on a technique's name.

SGLang's own ways (vanilla TP x DP, DP attention) are in `sgl_sidp.plan.vanilla`; each feature of the overlay declares
its own in its folder (`sgl_sidp/<feature>/planner.py`, named by `Feature.planner` in `sgl_sidp.features.FEATURES`).
`techniques()` collects them, the vanilla ones first, then the features in the table's order: the order in which
configurations are listed and names matched.

A technique's methods take the configuration (`configs.Configuration`: `dp`, `tp`, `sp`, `variant`, `options`) and,
for step times, the configuration's `steps.StepModel` (`model`), whose shared pieces they compose: `model.clocks`
(role -> `steps.ShardClock`), `model._collective_ms(op, n, tokens, per_layer, width)`, `model._gathered_terms(tokens,
n)`, `model._stream_terms()`, `model._decode_with`, `model._prefill_with`, `model.context` (tokens), `model.elt` (bytes
per element), `model.shapes` (`memory.ModelShapes`). A decision a technique makes once per model (SiDP's B_th,
Shift's threshold) is cached with `model.decided(key, compute)`.

This module imports nothing heavy (no torch, no SGLang, no feature): it is read by every planning run and by the
launcher's `--overlay-mode auto`.
"""

from __future__ import annotations

import math
import pkgutil
import re
from typing import Callable

#: a term of `Technique.terms` that a forward lacks: nothing to add (see `Technique.terms`)
NO_TERMS = (0.0, 0.0, -math.inf)

#: On a replica of several GPUs, SGLang's overlap scheduler processes a prefill's results (its first tokens) once its
#: launch of the next prefill returns, and that launch returns only when the GPU has about this many layers of it
#: left (`sim.StepTimes.release_share`: a share of 1 - PREFILL_QUEUE_LAYERS / layers of the next forward), where the
#: forward outlasts the host's launch of it (`PREFILL_HOST_MS_PER_LAYER`). Measured against SGLang's switch
#: SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1 and from the gap before a burst's last prefill, whose tokens leave as it
#: ends (a decode launch follows it), on 64 x (2,048 in, 32 out):
#: - Qwen3-32B (64 layers): 0.72 of 276-278 ms TP4 forwards on 4 x H200 (`overlap_on_4gpu_h200` against
#:   `overlap_off_4gpu_h200`), 0.72 of 370 and 493 ms TP2 forwards on 2 x H200 (`q32_release_2gpu_h200`): 1 - 18/64;
#: - Qwen3-8B TP2 (36 layers) on 2 x H200: 0.5 of ~120 ms forwards (`q8_overlap_on_ch8192_2gpu_h200`) and 0.49 of
#:   ~63 ms ones (`q8_release_ch4096_2gpu_h200`): 1 - 18/36; but 0 of ~32 ms ones (`q8_overlap_on_ch2048_2gpu_h200`).
#: On one GPU a replica the launch of the next prefill returned 253 ms before the one before it ended (DP4's ranks,
#: `burst_profile_4gpu_h200`), and Qwen3-8B TP1's first tokens came within -8 to +12 ms with and without the switch
#: (`q8_overlap_on_1gpu_h200`, forwards of ~200 ms): no delay there.
PREFILL_QUEUE_LAYERS = 18

#: Below this many ms a layer, a prefill forward ends before the host has launched the next one, so its first
#: tokens leave on time (`sim.StepTimes.release_min_ms`): between Qwen3-8B TP2's 0.9 (2,048-token forwards, no
#: delay) and 1.75 (4,096 tokens, the full share) ms a layer, measured on 2 x H200 (`PREFILL_QUEUE_LAYERS`)
PREFILL_HOST_MS_PER_LAYER = 1.3


class Technique:
    """One way of running a model on N GPUs, as the planner sees it. Subclasses set the class attributes and override
    the methods whose default does not fit them; every default is vanilla TP x DP's.

    Attributes:
        name: `Configuration.technique` ("vanilla", "dp_attention", "zerodp", "sidp", "shift").
        patterns: the regular expressions of its configurations' planner names, with named groups `dp`, `tp`, `sp`
            (sizes, 1 when absent) and `variant`; matched whole, options after them (`configs.configuration_named`).
        form: the forms of its names for an error message, e.g. "dpN_attn[_ep]".
        options: option -> what it sets: what a configuration name may end in (`Configuration.launch_flags` reads
            them); a trailing number is the option's value (`bth64`: B_th 64).
        valued: the options that take a number (the others take none).
        modeled_options: the options its step model predicts (ZeroDP's offload policies); a configuration named with
            another option (SiDP's `graphs`, Shift's `th1`) is listed by the planner as not predicted.
        vanilla: plain SGLang, started with `python -m sglang.launch_server`.
        host_role: the shard role (`shards`) whose calibration times the host's work of a decode step.
    """

    name: str = ""
    patterns: tuple[str, ...] = ()
    form: str = ""
    options: dict[str, str] = {}
    valued: frozenset[str] = frozenset()
    modeled_options: frozenset[str] = frozenset()
    vanilla: bool = False
    host_role: str = "forward"

    # ------------------------------------------------------------------ configurations (`configs`)
    def split_configurations(self, shapes, n_gpus: int, dp: int, tp: int) -> list:
        """Its configurations of `dp` replicas of TP `tp` (dp x tp = `n_gpus`; `configs.configurations` asks for each
        split in turn, TP 1 first), as `configs.Configuration`s; None entries are skipped. Default: none."""
        return []

    def node_configurations(self, shapes, n_gpus: int) -> list:
        """Its configurations spanning the whole node in another way (after every technique's splits): DP
        attention's, Shift's. Default: none."""
        return []

    def replica_name(self, dp: int, tp: int, variant: str = "") -> str:
        """The name of its configuration of `dp` replicas of TP `tp` in the DP-replica form `<name>_dp{dp}[_tp{tp}]
        [_{variant}]` (ZeroDP's, SiDP's)."""
        return f"{self.name}_dp{dp}" + (f"_tp{tp}" if tp > 1 else "") + (f"_{variant}" if variant else "")

    def launched_name(self, dp: int, tp_size: int, settings) -> str | None:
        """The planner's name of the configuration a server runs when launched with SGLang's `--dp-size dp` and
        `--tp-size tp_size` and this technique's resolved settings (`SidpConfig.<feature>`, after
        `Feature.resolve`), for the launcher's predicted-ratio line (`plan.verdict`). Default: None (unnamed)."""
        return None

    def variants(self, c, context: float) -> list[str]:
        """Names of configurations the planner also predicts beside its configuration `c` (`split_configurations`) for
        a workload whose requests hold `context` tokens on average (prompt and half the output): options whose value
        depends on the workload, e.g. ZeroDP's capacity-bound policy at that context. Default: none."""
        return []

    def known_failure(self, c, hf: dict) -> str | None:
        """Why SGLang (the pinned version) fails to start configuration `c` of the model whose config.json is `hf`,
        measured on GPUs, so that the planner neither predicts nor picks it; None where nothing is known. Default:
        None."""
        return None

    def wiring_check(self, c) -> bool:
        """Whether `c` is a check of the technique's wiring, not a way to serve (never a row of `bench.summary`).
        Default: no."""
        return False

    def launchable_unplanned(self, c, shapes) -> bool:
        """Whether `c`, which `configs.configurations` does not list for the model, still starts (a `wiring_check`
        the model allows), so that compare runs it. Default: no."""
        return False

    def check_name(self, name: str, groups: dict[str, str | None], options: tuple[str, ...]) -> None:
        """Refuses a configuration name its options do not fit beyond `options`/`valued` (raise ValueError with the
        message); `groups`: the pattern's. Default: every such name fits."""

    def server_tp(self, c) -> int:
        """SGLang's `--tp-size` of one replica (GPUs)."""
        return self.attn_tp(c)

    def attn_tp(self, c) -> int:
        """The attention TP of the KV cache's layout: each GPU holds 1/attn_tp of every token's KV heads."""
        return c.tp

    def shard_attn_tp(self, c, role: str) -> int:
        """The attention TP of the GPU that runs shard `role` (`shards`) as its calibration timed it: its KV heads per
        token. Default: the configuration's KV layout (`attn_tp`)."""
        return self.attn_tp(c)

    def served_prefill_factor(self, c, role: str, gpu: str) -> float:
        """How much longer a served prefill forward of shard `role` takes than its calibration (with the GPU kind's
        sustained clock, `steps.PREFILL_SUSTAINED_FACTOR`) gives, on GPU kind `gpu` (a `steps.GPUS` key): scales the
        shard's per-token prefill terms (`steps.ShardClock.served_prefill`). Default 1.0."""
        return 1.0

    def decode_graph_max_bs(self, c, sglang_default: int) -> int:
        """The largest decode batch the technique's server runs in a CUDA graph where the user sets none: SGLang's
        default for the GPU and TP size (`sglang_default`), unless the feature raises it (`Feature.sglang_defaults`)."""
        return sglang_default

    def dp_attention_dp(self, c) -> int:
        """The `--dp-size` SGLang's memory default sees with `--enable-dp-attention` (`memory.
        default_mem_fraction_static`'s `dp_attention_dp`); 0 without DP attention."""
        return 0

    def launch_flags(self, c, opts: dict[str, int | None], b_th: float | None,
                     shift_threshold: float | None) -> list[str]:
        """The launcher flags that start `c` (besides the model's): `Configuration.launch_flags`, `opts` its options
        (option -> value or None)."""
        return (["--tp-size", str(c.tp)] if c.tp > 1 else []) + (["--dp-size", str(c.dp)] if c.dp > 1 else [])

    def shards(self, c, shapes) -> dict:
        """What one GPU computes, by role (`configs.Shard`): `Configuration.shards`."""
        from sgl_sidp.plan.configs import shard_of

        return {"forward": shard_of(shapes, c.tp, c.tp, c.tp)}

    def weight_bytes_per_gpu(self, c, shapes, elt: int, sink_offload: tuple[int, ...], slots: int,
                             chunk: int) -> dict[str, int]:
        """Weight bytes on one GPU, by role: `Configuration.weight_bytes_per_gpu` (`chunk`: `--chunked-prefill-size`,
        for buffers sized by it)."""
        return {"gpu": shapes.weight_bytes(c.tp, c.tp, c.tp, elt)}

    def total_kv_tokens(self, c, kv: dict[str, int]) -> int:
        """KV tokens over all the configuration's replicas, from one replica's pool by role (`kv`)."""
        return kv["gpu"] * c.dp

    # ------------------------------------------------------------------ step times (`steps.StepModel`)
    def terms(self, model, size: float, role: str, variant: str | None, prefill: bool = False) -> tuple:
        """A forward of `size` (decode rows or prefill tokens) of a replica in `role` as (shard clock, SP, add1, add2,
        add3, at_least): the forward lasts the shard's + add1 + add2 + add3 ms, at least at_least ms (`StepModel.
        _terms`); `variant` stands for the configuration's (SiDP's B_th); `prefill`: a prefill forward (weight pulls
        slow it at `StepModel.prefill_copy_slowdown`), else a decode step."""
        return model.clock, 1, model._collective_ms("all_reduce", model.config.tp, size), 0.0, 0.0, -math.inf

    def streamed_bytes(self, model) -> int:
        """Weight bytes a GPU pulls per forward (bytes)."""
        return 0

    def copy_gbps(self, model) -> float:
        """The rate of those pulls in a forward (GB/s): the peer copy rate at the in-forward share."""
        return model.copy_gbps * model.copy_rate

    def replicas(self, model, kv: dict[str, int]) -> list:
        """The simulation's replicas (`steps.Replica`), from `Configuration.kv_tokens` by role."""
        from sgl_sidp.plan.steps import Replica

        return [Replica(model.step_times(), kv["gpu"]) for _ in range(model.config.dp)]

    def steps_variant(self, model) -> str:
        """The variant whose step times this configuration's equal (configurations that step alike, with the same
        KV, share one simulated schedule)."""
        return model.config.variant

    def decisions(self, model) -> dict:
        """What the technique decides from this cost model, for the table and the launch command ({} for none)."""
        return {}

    @property
    def model_attributes(self) -> dict[str, Callable]:
        """Attributes the technique gives its `StepModel`s: name -> function of the model (e.g. SiDP's "b_th", tokens
        per rank); `StepModel.__getattr__` answers them. None by default."""
        return {}

    # ------------------------------------------------------------------ the planner (`planner`)
    def memory(self, c, model, shapes, free_before_load: int, mem_fraction_static: float, elt: int) -> dict:
        """The keyword arguments of `Configuration.weight_bytes_per_gpu` / `kv_tokens` this configuration's decisions
        fix (ZeroDP's offload set, chosen on `model` when there is one); {} by default."""
        return {}

    def route(self, c) -> Callable | None:
        """How the DP controller sends each request to a replica (`planner.route_of`); None: round robin."""
        return None

    def release(self, c, layers: int) -> tuple[float, float]:
        """(share, ms): a back-to-back prefill forward of more than ms runs that share before the one before it has
        its results processed (`sim.StepTimes.release_share`, `release_min_ms`), for a model of `layers` layers.
        Default: `PREFILL_QUEUE_LAYERS` and `PREFILL_HOST_MS_PER_LAYER`'s on a replica of several GPUs; (0, 0), no
        delay, on one GPU and where the replicas step in lockstep (not measured)."""
        if self.server_tp(c) <= 1 or self.lockstep(c):
            return 0.0, 0.0
        return max(0.0, 1 - PREFILL_QUEUE_LAYERS / layers), PREFILL_HOST_MS_PER_LAYER * layers

    def lockstep(self, c) -> bool:
        """Whether configuration `c`'s DP replicas run each scheduler iteration together (`sim.simulate_lockstep`);
        False: each on its own."""
        return False


_TECHNIQUES: dict[str, Technique] = {}


def techniques() -> dict[str, Technique]:
    """Every technique the planner knows, name -> `Technique`: vanilla TP x DP and DP attention, then each feature's
    (`Feature.planner`, "module:attribute" resolved here, the first time)."""
    if not _TECHNIQUES:
        from sgl_sidp.features import FEATURES
        from sgl_sidp.plan.vanilla import DP_ATTENTION, VANILLA

        found = [VANILLA, DP_ATTENTION] + [pkgutil.resolve_name(f.planner) for f in FEATURES.values() if f.planner]
        _TECHNIQUES.update((t.name, t) for t in found)
    return _TECHNIQUES


def technique_named(name: str) -> Technique:
    """The technique called `name` (`Configuration.technique`).

    Raises:
        KeyError: no such technique.
    """
    return techniques()[name]


def option(text: str) -> tuple[str, int | None]:
    """("bth", 64) of "bth64"; ("graphs", None) of "graphs"."""
    m = re.fullmatch(r"([a-z]+)(\d*)", text)
    return (m.group(1), int(m.group(2)) if m and m.group(2) else None) if m else (text, None)
