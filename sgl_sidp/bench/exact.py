"""Exactness of a configuration against vanilla SGLang: greedy answers of fixed prompts on every DP rank, compared to
the answers of a vanilla reference token by token and logprob by logprob. Pure functions over HTTP bodies (no GPU
code); `sgl_sidp.bench.compare --exact` sends the requests, `tests/gpu` reuses the prompts and the comparison.

The reference of a configuration is vanilla TP of the size its answers must equal (`reference_name`): one replica's
TP for a DP mode (a DP replica computes what a TP replica of its size computes), TP = SP x TP for Shift (its shift
configuration is TP = P; its base configuration must give the same tokens).
"""

from __future__ import annotations

from typing import Mapping, Sequence

#: Prompts of 5 to 4,000 tokens (token ids of the bundled 4,096-id tokenizer; every family's vocabulary holds them).
PROMPTS: list[list[int]] = [list(range(7, 12)), list(range(100, 164)), [(i * 37) % 4000 + 3 for i in range(700)],
                            [(i * 11) % 4000 + 3 for i in range(2500)], [(i * 7) % 4000 + 3 for i in range(4000)]]
#: Greedy tokens generated per prompt.
NEW_TOKENS = 16


def reference_name(technique: str, dp: int, tp: int, sp: int = 1) -> str | None:
    """The vanilla configuration whose answers a configuration must give ("tp2"), or None for a vanilla one (it is a
    reference itself): TP of one replica's SGLang `--tp-size` (`Technique.server_tp`: a DP mode's replica TP, Shift's
    SP x TP)."""
    from sgl_sidp.plan.configs import Configuration

    c = Configuration(f"{technique}_reference", technique, dp, tp, sp)
    return None if c.vanilla else f"tp{c.server_tp}"


def greedy_body(ids: Sequence[int], new_tokens: int = NEW_TOKENS, dp_rank: int | None = None) -> dict:
    """SGLang's native `/generate` body of a greedy generation of exactly `new_tokens` tokens with their logprobs,
    on DP rank `dp_rank` (SGLang's `routed_dp_rank`) when given."""
    body = {"input_ids": list(ids), "return_logprob": True, "stream": False,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    if dp_rank is not None:
        body["routed_dp_rank"] = dp_rank
    return body


def parse_answer(resp: Mapping) -> dict:
    """`{"ids": [int], "logprobs": [float], "dp_rank": int | None}` of a non-streamed `/generate` answer
    (`meta_info.output_token_logprobs` = [[logprob, id, text], ...]; `meta_info.dp_rank` where SGLang reports it)."""
    meta = resp.get("meta_info") or {}
    lp = meta.get("output_token_logprobs") or []
    return {"ids": [int(x[1]) for x in lp], "logprobs": [None if x[0] is None else float(x[0]) for x in lp],
            "dp_rank": meta.get("dp_rank")}


def answer_diff(ref: Mapping, got: Mapping) -> dict:
    """How answer `got` differs from `ref` (both as `parse_answer` gives them).

    Returns:
        `tokens_equal`, `bit_identical` (tokens and every logprob equal), `first_differing_token` (index, None when
        the tokens agree), `logprob_gap` (largest |logprob difference| in nats before that token: after it the two
        answers condition on different tokens).
    """
    a, b = ref["ids"], got["ids"]
    first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    upto = len(a) if first is None else first
    pairs = [(x, y) for x, y in zip(ref["logprobs"][:upto], got["logprobs"][:upto]) if x is not None and y is not None]
    gap = max((abs(x - y) for x, y in pairs), default=0.0)
    return {"tokens_equal": first is None, "bit_identical": first is None and all(x == y for x, y in pairs),
            "first_differing_token": first, "logprob_gap": gap}


def verdict(ref: Mapping, got: Mapping) -> dict:
    """The exactness of a configuration's answers against its reference's.

    Args:
        ref: the reference's answers, `{"prompt_lens": [int], "ranks": {"0": [answer per prompt]}}` (one rank).
        got: the configuration's, the same form with one entry per DP rank.

    Returns:
        `answers` (prompts x ranks compared), `bit_identical` and `tokens_equal` (every answer), `max_logprob_gap`
        (nats, over the tokens before each answer's first difference), `first_difference` (None, or the first
        differing answer: `rank`, `prompt_len`, `token`, `logprob_gap` before it), `missing` (answers not compared:
        prompts a side lacks).
    """
    reference = next(iter(ref["ranks"].values()), [])
    diffs, first, missing = [], None, 0
    for rank, answers in sorted(got["ranks"].items(), key=lambda kv: int(kv[0])):
        for i, length in enumerate(got["prompt_lens"]):
            if i >= len(answers) or i >= len(reference) or not answers[i] or not reference[i]:
                missing += 1
                continue
            d = answer_diff(reference[i], answers[i])
            diffs.append(d)
            if first is None and not d["tokens_equal"]:
                first = {"rank": int(rank), "prompt_len": length, "token": d["first_differing_token"],
                         "logprob_gap": d["logprob_gap"]}
    return {"answers": len(diffs), "bit_identical": bool(diffs) and all(d["bit_identical"] for d in diffs),
            "tokens_equal": bool(diffs) and all(d["tokens_equal"] for d in diffs),
            "max_logprob_gap": max((d["logprob_gap"] for d in diffs), default=None), "first_difference": first,
            "missing": missing}


def describe(v: Mapping | None) -> str:
    """One cell of a report: "bit-identical (10 answers)", "tokens equal, logprobs within 0.0012", or where the first
    token differs and the logprob gap before it."""
    if not v:
        return "-"
    if not v["answers"]:
        return "no answers compared"
    if v["bit_identical"]:
        text = f"bit-identical ({v['answers']} answers)"
    elif v["tokens_equal"]:
        text = f"tokens equal ({v['answers']} answers), logprobs within {v['max_logprob_gap']:.3g}"
    else:
        f = v["first_difference"]
        text = (f"differs: DP{f['rank']}, {f['prompt_len']:,}-token prompt, token {f['token']} "
                f"(logprob gap before it {f['logprob_gap']:.3g})")
    return text + (f"; {v['missing']} missing" if v["missing"] else "")
