"""`sgl_sidp.bench.exact`: which reference a configuration is held to, and how two greedy answers differ."""

import pytest

from sgl_sidp.bench import exact


def ans(ids, lps):
    return {"ids": ids, "logprobs": lps, "dp_rank": None}


@pytest.mark.parametrize("args, ref", [(("sidp", 2, 1), "tp1"), (("sidp", 2, 2), "tp2"), (("zerodp", 4, 1), "tp1"),
                                       (("shift", 1, 1, 2), "tp2"), (("shift", 1, 2, 2), "tp4"),
                                       (("vanilla", 2, 1), None), (("dp_attention", 2, 1), None)])
def test_dp_modes_are_held_to_one_replicas_tp_and_shift_to_all_its_gpus(args, ref):
    assert exact.reference_name(*args) == ref


def test_answer_diff_separates_bit_identical_from_equal_tokens_and_reports_the_gap_before_the_first_difference():
    a = ans([1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4])
    assert exact.answer_diff(a, a) == {"tokens_equal": True, "bit_identical": True, "first_differing_token": None,
                                       "logprob_gap": 0.0}
    d = exact.answer_diff(a, ans([1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.41]))
    assert d["tokens_equal"] and not d["bit_identical"] and d["logprob_gap"] == pytest.approx(0.01)
    d = exact.answer_diff(a, ans([1, 2, 9, 4], [-0.1, -0.25, -5.0, -0.4]))
    assert d["first_differing_token"] == 2 and d["logprob_gap"] == pytest.approx(0.05)  # after it: not compared
    assert exact.answer_diff(a, ans([1, 2], [-0.1, -0.2]))["first_differing_token"] == 2  # a shorter answer differs


def test_verdict_over_ranks_names_the_first_differing_answer():
    ref = {"prompt_lens": [5, 700], "ranks": {"0": [ans([1, 2], [-1.0, -2.0]), ans([3, 4], [-1.0, -2.0])]}}
    same = {"prompt_lens": [5, 700], "ranks": {"0": ref["ranks"]["0"], "1": ref["ranks"]["0"]}}
    v = exact.verdict(ref, same)
    assert v["bit_identical"] and v["answers"] == 4 and exact.describe(v) == "bit-identical (4 answers)"
    other = {"prompt_lens": [5, 700], "ranks": {"0": ref["ranks"]["0"],
                                                 "1": [ref["ranks"]["0"][0], ans([3, 5], [-1.5, -2.0])]}}
    v = exact.verdict(ref, other)
    assert v["first_difference"] == {"rank": 1, "prompt_len": 700, "token": 1, "logprob_gap": 0.5}
    assert exact.describe(v) == "differs: DP1, 700-token prompt, token 1 (logprob gap before it 0.5)"
    short = {"prompt_lens": [5, 700], "ranks": {"0": [ref["ranks"]["0"][0]]}}
    assert exact.describe(exact.verdict(ref, short)) == "bit-identical (1 answers); 1 missing"


def test_the_request_body_is_greedy_with_logprobs_on_the_rank_asked_for():
    body = exact.greedy_body([5, 6], 4, dp_rank=1)
    assert body["sampling_params"] == {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    assert body["return_logprob"] and body["routed_dp_rank"] == 1 and "routed_dp_rank" not in exact.greedy_body([5])
    resp = {"meta_info": {"output_token_logprobs": [[-0.5, 7, None], [None, 8, None]], "dp_rank": 1}}
    assert exact.parse_answer(resp) == {"ids": [7, 8], "logprobs": [-0.5, None], "dp_rank": 1}
