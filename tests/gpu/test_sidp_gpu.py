"""SiDP WaS on two GPUs (run with `pytest -m gpu`): exactness against vanilla SGLang, KV capacity against vanilla DP2.

Servers start through our launcher (`--dp-size 2 --overlay-mode sidp`); requests are pinned to DP0 and DP1 with
SGLang's `routed_dp_rank`. Each rank streams the FFN layers the other owns (layer l is owned by DP rank l mod 2):

- the tiny 8-layer dense Qwen3 with a different random tensor per layer (`make_tiny_models.py --big`, path in
  $SIDP_TINY_DENSE), against vanilla `sglang.launch_server` on one GPU: tokens and logprobs bit-identical
  (SGLang's own MLP computes on a bit-exact copy of the owner's weights);
- Qwen3-32B (`--load-format dummy`), against vanilla `--dp-size 2` on the same GPUs: the same tokens, and each
  rank's KV tokens next to vanilla's;
- Llama-3.1-70B at TP1 DP2 (141 GB of weights: vanilla DP cannot load it on a 141 GB GPU): SiDP loads it, because
  a rank never holds the layers it does not own, and both ranks answer alike.

Logs and a facts file per server go to $SIDP_GPU_LOGS.
"""

import os
import re
from pathlib import Path

import pytest

from servers import (COMMON, PROMPTS, Server, answer_diff, at_once, flush_cache, greedy, model_args, needs_gpu_memory,
                     summary, vanilla_reference)

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2)]

TINY_DENSE = Path(os.environ.get("SIDP_TINY_DENSE", "/tmp/tiny/qwen3-big"))


def sidp(log_dir, name, model, extra=(), port=23000):
    return Server("sgl_sidp.launch_server", [*model, *COMMON, "--dp-size", "2", "--overlay-mode", "sidp", *extra],
                  port=port, log_path=log_dir / f"{name}.log", gpus="0,1")


def exact(ref, got, what):
    assert got[0] == ref[0], f"{what}: tokens differ: {ref[0]} vs {got[0]}"
    assert got[1] == ref[1], f"{what}: logprobs differ by up to {max(abs(a - b) for a, b in zip(ref[1], got[1]))}"


def each_rank_exact(srv, ref, prompts, n=16):
    """Greedy answers pinned to DP0 and DP1 of `srv` equal `ref` (tokens and logprobs) on each of `prompts`."""
    for dp in (0, 1):
        for i, p in enumerate(prompts):
            exact(ref[i], greedy(srv.base_url, p, dp_rank=dp, n=n), f"DP{dp} prompt {i} ({len(p)} tokens)")


def set_up_lines(log):
    """{dp rank: (owned description, streamed layer count)} from the ranks' set-up lines (TP0)."""
    return {int(m.group(1)): (m.group(2), int(m.group(3)))
            for m in re.finditer(r"sgl-sidp sidp DP(\d) TP0: owns FFN layers (.*?) \(.*?streams (\d+) layers", log)}


def kv_of(log):
    return {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"sgl-sidp sidp DP(\d) TP0: KV cache (\d+) tokens", log)}


@pytest.fixture(scope="module")
def tiny_dense_reference(log_dir):
    return vanilla_reference(log_dir, TINY_DENSE, "tiny_dense_vanilla", 23100, "SIDP_TINY_DENSE", batched=(1, 2))


@pytest.mark.foldable
def test_tiny_dense_was_exact_against_vanilla(log_dir, tiny_dense_reference):
    ref = tiny_dense_reference[0]
    model = ["--model-path", str(TINY_DENSE)]
    with sidp(log_dir, "tiny_dense_sidp_was", model, ["--sidp-service", "was"]) as srv:
        each_rank_exact(srv, ref, PROMPTS)
        log = srv.log_text()
    lines = set_up_lines(log)
    assert sorted(lines) == [0, 1] and all(n == 4 for _, n in lines.values()), lines
    summary(log_dir, "tiny_dense_sidp_was", set_up=lines, kv=kv_of(log), prompts=[len(p) for p in PROMPTS])


@pytest.fixture(scope="module")
def qwen3_8b_reference(log_dir):
    """Vanilla TP1's greedy answers (8 tokens) on Qwen3-8B shapes (dummy weights) for the first 4 PROMPTS."""
    model = model_args("Qwen3-8B")
    with Server("sglang.launch_server", [*model, *COMMON, "--max-total-tokens", "100000"], port=23500,
                log_path=log_dir / "qwen3_8b_vanilla_tp1.log", gpus="0") as srv:
        return [greedy(srv.base_url, p, n=8) for p in PROMPTS[:4]]


@pytest.mark.foldable
def test_qwen3_8b_was_exact_against_vanilla_tp1(log_dir, qwen3_8b_reference):
    """Real shapes (36 layers of 302 MB FFN weights, dummy weights): each rank equals vanilla TP1 bit for bit."""
    model, ref = model_args("Qwen3-8B"), qwen3_8b_reference
    with sidp(log_dir, "qwen3_8b_sidp_was", model, ["--sidp-service", "was"], port=23600) as srv:
        each_rank_exact(srv, ref, PROMPTS[:4], n=8)
        log = srv.log_text()
    lines = set_up_lines(log)
    assert sorted(lines) == [0, 1] and all(n == 18 for _, n in lines.values()), lines
    summary(log_dir, "qwen3_8b_sidp_was", set_up=lines, kv=kv_of(log))


def compare(ref, got, what, facts):
    """Record in `facts` under `what` how `got` differs from `ref` (`servers.answer_diff`)."""
    facts[what] = answer_diff(ref, got)


def assert_alone_exact(facts):
    """Requests computed with no other request anywhere in the group equal vanilla bit for bit."""
    bad = {k: v for k, v in facts.items() if k.startswith("alone") and (not v["tokens_equal"] or v["logprob_gap"])}
    assert not bad, f"answers computed alone differ from vanilla: {bad}"


def sidp_answers(srv, ref, facts, prefix="alone"):
    """Each prompt alone on DP0, then on DP1 (the other rank idle), compared with `ref`."""
    for dp in (0, 1):
        for i, p in enumerate(PROMPTS[:len(ref)]):
            compare(ref[i], greedy(srv.base_url, p, dp_rank=dp, n=len(ref[i][0])), f"{prefix}_dp{dp}_p{i}", facts)


@pytest.mark.foldable
def test_tiny_dense_cas_exact(log_dir, tiny_dense_reference):
    """CaS (`--sidp-service cas`, eager) against vanilla TP1 (decode in CUDA graphs).

    - Alone (the other rank idle, serving its owned layers from its scheduler): tokens and logprobs bit-identical.
    - One request per rank at once: each rank's own batch is vanilla's, but the owner's one GEMM covers both ranks'
      rows (M = 2 at decode); cuBLAS may pick another kernel for another M, so bf16 results may round differently.
      Measured, not asserted.
    - Two requests per rank at once, against vanilla given the same two at once (SGLang batches them). Measured.
    """
    alone, together = tiny_dense_reference
    model = ["--model-path", str(TINY_DENSE)]
    facts = {}
    with sidp(log_dir, "tiny_dense_sidp_cas", model, ["--sidp-service", "cas", "--no-sidp-cas-graphs"], port=23700) as srv:
        sidp_answers(srv, alone, facts)
        for a, b in ((1, 2), (2, 1), (3, 4)):
            flush_cache(srv.base_url)
            got = at_once(srv.base_url, [(PROMPTS[a], 0), (PROMPTS[b], 1)])
            compare(alone[a], got[0], f"one_per_rank_dp0_p{a}_with_dp1_p{b}", facts)
            compare(alone[b], got[1], f"one_per_rank_dp1_p{b}_with_dp0_p{a}", facts)
        flush_cache(srv.base_url)
        got = at_once(srv.base_url, [(PROMPTS[i], dp) for dp in (0, 1) for i in (1, 2)])
        for k, (dp, i) in enumerate((dp, i) for dp in (0, 1) for i in (1, 2)):
            compare(together[i - 1], got[k], f"two_per_rank_dp{dp}_p{i}_vs_vanilla_batched", facts)
        cas_log = srv.log_text()
    summary(log_dir, "tiny_dense_sidp_cas", answers=facts)
    assert "DP ranks in lockstep (cas); CaS rows over" in cas_log
    assert_alone_exact(facts)


def test_tiny_dense_cas_graphs(log_dir, tiny_dense_reference):
    """`--sidp-cas-graphs` (two GPUs: NCCL): CaS decodes replay the CaS graph set, every rank at one size.

    Alone, the idle rank sends one zero row per decode, so the owner's GEMM has M = 2 where vanilla's has M = 1: the
    bf16 results may round differently (as CaS with both ranks busy). Measured, not asserted; asserted: the set was
    captured, and every answer's first token (computed by an eager prefill) is vanilla's.
    """
    alone, _ = tiny_dense_reference
    facts = {}
    with sidp(log_dir, "tiny_dense_sidp_cas_graphs", ["--model-path", str(TINY_DENSE)],
              ["--sidp-service", "cas", "--sidp-cas-graphs"], port=23750) as srv:
        sidp_answers(srv, alone, facts)
        flush_cache(srv.base_url)
        got = at_once(srv.base_url, [(PROMPTS[1], 0), (PROMPTS[2], 1)])
        compare(alone[1], got[0], "one_per_rank_dp0_p1_with_dp1_p2", facts)
        compare(alone[2], got[1], "one_per_rank_dp1_p2_with_dp0_p1", facts)
        log = srv.log_text()
    summary(log_dir, "tiny_dense_sidp_cas_graphs", answers=facts)
    assert re.search(r"CaS decode CUDA graphs captured for \d+ sizes", log), "no CaS graph set captured"
    assert all(v["first_differing_token"] != 0 for v in facts.values()), facts


@pytest.mark.foldable
def test_tiny_dense_auto_switches_mid_generation(log_dir, tiny_dense_reference):
    """Auto with B_th 64 tokens per rank: a prompt's prefill (>= 128 tokens on one rank) runs WaS, its decode
    (1 token) CaS, so every generation of a long prompt switches in the middle; bit-identical to vanilla alone."""
    alone, _ = tiny_dense_reference
    facts = {}
    with sidp(log_dir, "tiny_dense_sidp_auto", ["--model-path", str(TINY_DENSE)],
              ["--sidp-service", "auto", "--sidp-b-th", "64"], port=23800) as srv:
        sidp_answers(srv, alone, facts)
        auto_log = srv.log_text()
    switches = re.findall(r"sgl-sidp sidp DP(\d) TP0: (WaS|CaS) from this iteration", auto_log)
    summary(log_dir, "tiny_dense_sidp_auto", answers=facts, switch_lines=len(switches))
    assert {("0", "WaS"), ("0", "CaS"), ("1", "WaS"), ("1", "CaS")} <= set(switches), switches[:8]
    assert_alone_exact(facts)


def test_qwen3_8b_auto_measures_b_th_at_start_up(log_dir, qwen3_8b_reference):
    """`--sidp-b-th-measure` (two GPUs: CaS graphs over NCCL): both ranks time WaS and CaS decode steps after the CaS
    graphs are captured, log the same B_th and the slowest rank's step times, and then serve vanilla's tokens."""
    model, ref = model_args("Qwen3-8B"), qwen3_8b_reference
    facts = {}
    with sidp(log_dir, "qwen3_8b_sidp_auto_measured", model, ["--sidp-service", "auto", "--sidp-b-th-measure"],
              port=23950) as srv:
        sidp_answers(srv, ref, facts)
        log = srv.log_text()
    lines = re.findall(r"sgl-sidp sidp DP(\d) TP0: B_th (\S+) tokens per rank \(--sidp-b-th-measure: measured at "
                       r"start-up on this group's GPUs[^)]*\); decode step ms \(WaS, CaS[^)]*\), the slowest rank's, by rows "
                       r"per rank: (.*)", log)
    summary(log_dir, "qwen3_8b_sidp_auto_measured", answers=facts, b_th_lines=lines)
    assert {r for r, _, _ in lines} == {"0", "1"} and len({(b, p) for _, b, p in lines}) == 1, lines
    assert_alone_exact(facts)


@pytest.mark.foldable
def test_qwen3_8b_auto_exact_against_vanilla_tp1(log_dir, qwen3_8b_reference):
    """Qwen3-8B shapes (dummy weights), auto with B_th 64: WaS prefill, CaS decode, bit-identical to vanilla TP1."""
    model, ref = model_args("Qwen3-8B"), qwen3_8b_reference
    facts = {}
    with sidp(log_dir, "qwen3_8b_sidp_auto", model, ["--sidp-service", "auto", "--sidp-b-th", "64"],
              port=23900) as srv:
        sidp_answers(srv, ref, facts)
        log = srv.log_text()
    switches = re.findall(r"sgl-sidp sidp DP(\d) TP0: (WaS|CaS) from this iteration", log)
    summary(log_dir, "qwen3_8b_sidp_auto", answers=facts, switch_lines=len(switches))
    assert {"WaS", "CaS"} <= {m for _, m in switches}, switches[:8]
    assert_alone_exact(facts)


def test_qwen3_32b_was_matches_vanilla_dp2_and_holds_more_kv(log_dir):
    model = model_args("Qwen3-32B")
    with Server("sglang.launch_server", [*model, *COMMON, "--dp-size", "2"], port=23200,
                log_path=log_dir / "qwen3_32b_vanilla_dp2.log", gpus="0,1") as srv:
        ref = [greedy(srv.base_url, p, dp_rank=0, n=8) for p in PROMPTS[:3]]
        vanilla_log = srv.log_text()
    vanilla_kv = [int(x) for x in re.findall(r"max_total_num_tokens=(\d+)", vanilla_log)]
    with sidp(log_dir, "qwen3_32b_sidp_was", model, ["--sidp-service", "was"], port=23300) as srv:
        each_rank_exact(srv, ref, PROMPTS[:3], n=8)
        log = srv.log_text()
    kv = kv_of(log)
    summary(log_dir, "qwen3_32b_sidp_was", set_up=set_up_lines(log), kv=kv, vanilla_kv=vanilla_kv,
            kv_ratio=[kv[r] / vanilla_kv[0] for r in sorted(kv)] if vanilla_kv else None)
    assert vanilla_kv and all(kv[r] > 1.3 * vanilla_kv[0] for r in (0, 1))  # half the FFN (25 GB) freed, less 2 slots, (kv, vanilla_kv)


def test_llama_70b_tp1_dp2_loads_and_serves(log_dir):
    needs_gpu_memory(120, "a SiDP rank holds Llama-3.1-70B's attention and half its FFN layers: about 84 GB")
    with sidp(log_dir, "llama_70b_sidp_was", model_args("Llama-3.1-70B"), ["--sidp-service", "was"],
              port=23400) as srv:
        a = [greedy(srv.base_url, p, dp_rank=0, n=4) for p in PROMPTS[:2]]
        b = [greedy(srv.base_url, p, dp_rank=1, n=4) for p in PROMPTS[:2]]
        log = srv.log_text()
    assert [x[0] for x in a] == [x[0] for x in b]
    held = re.findall(r"\((\d+) of (\d+) layers never held while loading\)", log)
    summary(log_dir, "llama_70b_sidp_was", kv=kv_of(log), set_up=set_up_lines(log), never_held=held)
    assert held and all(x == y for x, y in held), held
