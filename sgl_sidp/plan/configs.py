"""The configurations a model can run in on N GPUs of one node, with what each GPU holds and computes.

A configuration's **shard** is what one of its GPUs computes in a forward: attention heads, KV heads, FFN and expert
intermediate sizes and vocabulary after its splits. One GPU can time it: SGLang runs the model with the shard's sizes
(`Shard.override_args` as `--json-model-override-args`, dummy weights) at TP1, and the communication a configuration
adds comes from the interconnect table. Its **memory** (weights per GPU, KV tokens) follows SGLang's own accounting
(`sgl_sidp.calibration.memory`).

Names (the planner's JSON keeps them): `tp{t}` (one replica), `dp{d}` (replicas of TP1), `tp{t}_dp{d}`, `dp{d}_attn`
(SGLang's DP attention: attention data-parallel, the FFN TP over all GPUs), `zerodp_dp{d}` (MoE), `sidp_dp{d}_{was,
cas,auto}` (dense), `shift_sp{sp}_tp{tp}` (dense; base (SP, TP), shift TP = SP x TP). A name may end in options that
pick a launch setting the planner does not vary (`Technique.options`; `configuration_named` reads both, `Configuration.
launch_flags` turns them into flags): `dp4_attn_ep`, `zerodp_dp2_all`, `sidp_dp2_cas_graphs`, `sidp_dp2_auto_bth64`,
`shift_sp2_tp1_th1_exact`, `zerodp_dp2_pf8192`.
"""

from __future__ import annotations

import dataclasses
import re

from sgl_sidp.calibration.memory import ModelShapes, kv_tokens
from sgl_sidp.plan.sim import ReplicaLimits
from sgl_sidp.plan.technique import Technique, option, technique_named, techniques

#: tokens of a prefill chunk where none is given (SGLang's `--chunked-prefill-size` on H100 and H200)
DEFAULT_CHUNK = ReplicaLimits.chunked_prefill


@dataclasses.dataclass(frozen=True)
class Shard:
    """What one GPU of a configuration computes (`ModelShapes` sizes after the splits).

    Attributes:
        heads, kv_heads: attention heads and KV heads on the GPU.
        intermediate, expert_intermediate, shared_intermediate: FFN sizes on the GPU (dense layers, each routed expert,
            the shared expert(s)).
        vocab: vocabulary rows of the embedding and lm_head on the GPU.
        tokens_share: the fraction of a forward's tokens its linear layers see (Shift's base configuration: 1/SP).
    """

    heads: int
    kv_heads: int
    intermediate: int
    expert_intermediate: int
    shared_intermediate: int
    vocab: int
    tokens_share: float = 1.0

    def override_args(self, shapes: ModelShapes) -> dict:
        """SGLang's `--json-model-override-args` that make a TP1 server compute this shard (head_dim pinned, since
        some models derive it from hidden / heads)."""
        args = {"num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": shapes.head_dim,
                "vocab_size": self.vocab}
        if shapes.intermediate:
            args["intermediate_size"] = self.intermediate
        if shapes.experts:
            args["moe_intermediate_size"] = self.expert_intermediate
        if shapes.shared_intermediate and shapes.shared_intermediate != shapes.expert_intermediate:
            args["shared_expert_intermediate_size"] = self.shared_intermediate
        return args


def shard_of(shapes: ModelShapes, attn_tp: int, mlp_tp: int, vocab_tp: int, tokens_share: float = 1.0) -> Shard:
    """The shard of attention TP `attn_tp`, FFN TP `mlp_tp` and vocabulary TP `vocab_tp` (KV heads replicated where
    `attn_tp` exceeds them, as SGLang does).

    Raises:
        ValueError: a size that does not split evenly (heads, intermediate sizes, vocabulary).
    """
    odd = [f"{what} {n} over {tp}" for what, n, tp in (
        ("attention heads", shapes.heads, attn_tp), ("intermediate size", shapes.intermediate, mlp_tp),
        ("expert intermediate size", shapes.expert_intermediate, mlp_tp),
        ("shared expert intermediate size", shapes.shared_intermediate, mlp_tp)) if n % tp]
    if shapes.kv_heads > attn_tp and shapes.kv_heads % attn_tp:
        odd.append(f"KV heads {shapes.kv_heads} over {attn_tp}")
    if odd:
        raise ValueError("does not shard: " + ", ".join(odd))
    return Shard(heads=shapes.heads // attn_tp, kv_heads=shapes.kv_heads_per_gpu(attn_tp),
                 intermediate=shapes.intermediate // mlp_tp, expert_intermediate=shapes.expert_intermediate // mlp_tp,
                 shared_intermediate=shapes.shared_intermediate // mlp_tp, vocab=-(-shapes.vocab // vocab_tp),
                 tokens_share=tokens_share)


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One way to run a model on `dp * tp * sp` GPUs.

    Attributes:
        name: e.g. "tp2", "dp2_attn", "zerodp_dp2", "sidp_dp2_auto", "shift_sp2_tp1" (with its options, if any:
            "sidp_dp2_cas_graphs").
        technique: "vanilla", "dp_attention", "zerodp", "sidp" or "shift".
        dp, tp, sp: DP replicas, TP per replica (Shift: TP of the base configuration), SP (Shift's base only).
        variant: SiDP's service ("was", "cas", "auto"); "" otherwise.
        options: launch settings the name ends in (`Technique.options`), e.g. ("graphs",) or ("bth64",); () for the planner's.
    """

    name: str
    technique: str
    dp: int
    tp: int
    sp: int = 1
    variant: str = ""
    options: tuple[str, ...] = ()

    @property
    def base_name(self) -> str:
        """The planner's name of the configuration (the name without its options)."""
        return self.name[: len(self.name) - sum(len(o) + 1 for o in self.options)] if self.options else self.name

    @property
    def kind(self) -> Technique:
        """Its technique's planner object (`technique.technique_named(technique)`), which every method below asks."""
        return technique_named(self.technique)

    @property
    def vanilla(self) -> bool:
        """Plain SGLang (TP, DP, TP x DP, DP attention): started with `python -m sglang.launch_server`."""
        return self.kind.vanilla

    @property
    def launcher(self) -> str:
        """The module that starts it: SGLang's own launcher for vanilla configurations, ours for the techniques."""
        return "sglang.launch_server" if self.vanilla else "sgl_sidp.launch_server"

    @property
    def server_tp(self) -> int:
        """SGLang's `--tp-size` of one replica (DP attention: every GPU; Shift: SP x TP)."""
        return self.kind.server_tp(self)

    def launch_flags(self, b_th: float | None = None, shift_threshold: float | None = None) -> list[str]:
        """The launcher flags (besides the model's) that start this configuration: SGLang's `--tp-size`/`--dp-size`/
        `--enable-dp-attention`, the overlay's mode and the settings its options and the given decisions pick (SiDP
        auto's B_th in tokens per rank, Shift's threshold in tokens per forward; an option wins over a decision;
        ZeroDP's policy is its options'). `python -m sgl_sidp.launch_server` accepts all of them; the vanilla ones are
        SGLang's."""
        return self.kind.launch_flags(self, self.option_values, b_th, shift_threshold)

    @property
    def option_values(self) -> dict[str, int | None]:
        """Its options by name, with their values: ("all", "pf8192") -> {"all": None, "pf": 8192} (`option`)."""
        return dict(option(o) for o in self.options)

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.sp

    @property
    def attn_tp(self) -> int:
        """The attention TP of the KV cache's layout: each GPU holds 1/attn_tp of every token's KV heads (DP
        attention: 1; Shift: SP x TP, its one cache in the TP = P layout)."""
        return self.kind.attn_tp(self)

    def shards(self, shapes: ModelShapes) -> dict[str, Shard]:
        """What one GPU computes, by role: "forward" for most; Shift has "shift" (TP = P) and "base": the TP_b model
        on 1/SP of the tokens, whose linears are the base configuration's and whose decode attention does the same
        work (tokens x heads: T/SP x H/TP_b = T x H/P; a prefill's attention, quadratic in a request's length, does
        SP times more in the base configuration than this shard). DP attention's attention is whole and its FFN split
        over all GPUs."""
        return self.kind.shards(self, shapes)

    def weight_bytes_per_gpu(self, shapes: ModelShapes, elt: int = 2, sink_offload: tuple[int, ...] = (),
                             slots: int = 2, chunk: int = DEFAULT_CHUNK) -> dict[str, int]:
        """Weights on one GPU, by role ("gpu"; ZeroDP: "source" and "sink", whose `sink_offload` layers' experts
        it pulls into `slots` slots; SiDP: a rank owning its share of the FFN layers, with `slots` slots), with the
        buffers a `chunk`-token prefill chunk sizes (Shift's exchange buffer; SGLang's 8,192 on H100 and H200)."""
        return self.kind.weight_bytes_per_gpu(self, shapes, elt, sink_offload, slots, chunk)

    def kv_tokens(self, shapes: ModelShapes, free_before_load: int, mem_fraction_static: float, elt: int = 2,
                  **memory) -> dict[str, int]:
        """KV tokens of one replica's pool by role (as `weight_bytes_per_gpu`; a TP group's GPUs each hold their
        heads of every token), and "total": summed over the DP replicas (ZeroDP: one source, the rest sinks)."""
        per_token = shapes.kv_bytes_per_token(self.attn_tp, elt)
        out = {role: kv_tokens(free_before_load, mem_fraction_static, w, per_token)
               for role, w in self.weight_bytes_per_gpu(shapes, elt, **memory).items()}
        out["total"] = self.kind.total_kv_tokens(self, out)
        return out


def configurations(shapes: ModelShapes, n_gpus: int) -> list[Configuration]:
    """Every configuration of the model on `n_gpus` GPUs that the model's shapes allow (heads and intermediate sizes
    that split evenly; ZeroDP for MoE models, SiDP and Shift for dense ones): each technique's
    (`Technique.split_configurations` for every split of the GPUs into DP x TP, TP 1 first, then `Technique.
    node_configurations`), in the order of `technique.techniques`."""
    kinds = techniques().values()
    out = []
    for tp in (d for d in range(1, n_gpus + 1) if n_gpus % d == 0):
        for kind in kinds:
            out += kind.split_configurations(shapes, n_gpus, n_gpus // tp, tp)
    for kind in kinds:
        out += kind.node_configurations(shapes, n_gpus)
    fits = []
    for c in filter(None, out):
        try:
            c.shards(shapes)
        except ValueError:
            continue
        fits.append(c)
    return fits


def __getattr__(name: str):
    if name == "OPTIONS":  # option -> what it sets, by technique (`Technique.options`)
        return {t.name: t.options for t in techniques().values() if t.options}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def configuration_named(name: str) -> Configuration:
    """The configuration a name gives: a planner name (`configurations`), optionally followed by options of its
    technique (`Technique.options`), e.g. "sidp_dp2_tp2_cas_graphs" or "shift_sp2_tp1_th1".

    Raises:
        ValueError: a name of no known form, an option its technique does not have (or a value it needs missing),
            or a size below 1; the message lists the forms.
    """
    kinds = techniques().values()
    found = [(kind, m) for kind in kinds for pattern in kind.patterns
             if (m := re.fullmatch(pattern + r"(?P<opts>(?:_[a-z]+\d*)*)", name))]
    for kind, m in sorted(found, key=lambda tm: len(tm[1]["opts"]))[:1]:  # the longest planner name
        g = m.groupdict()
        dp, tp, sp = (int(g.get(k) or 1) for k in ("dp", "tp", "sp"))
        if min(dp, tp, sp) < 1:
            raise ValueError(f"configuration {name}: sizes must be at least 1")
        options = tuple(o for o in g["opts"].split("_") if o)
        for o in options:
            key, value = option(o)
            if key not in kind.options:
                have = ", ".join(kind.options) or "none"
                raise ValueError(f"configuration {name}: {kind.name} has no option {o!r} (options: {have})")
            if (key in kind.valued) != (value is not None):
                raise ValueError(f"configuration {name}: option {o!r} " + ("needs a number" if value is None else
                                                                              "takes no number"))
        kind.check_name(name, g, options)
        return Configuration(name, kind.name, dp, tp, sp, g.get("variant") or "", options)
    forms = [kind.form for kind in kinds if kind.form]
    raise ValueError(f"configuration {name!r}: expected {', '.join(forms[:-1])} or {forms[-1]}")
