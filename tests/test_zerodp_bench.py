"""scripts/zerodp_compare.py, retired into `python -m sgl_sidp.bench.compare`: its old flags mapped onto compare's two
calls; and the helpers compare reads a ZeroDP server with (sgl_sidp.bench.server_stats, the stream's DP rank), on
samples in SGLang 0.5.17's formats. No GPU, no server, no subprocess."""

import runpy
from pathlib import Path

import pytest

from sgl_sidp.bench.client import CHUNK_PARSERS
from sgl_sidp.bench.server_stats import (
    capacity_from_loads,
    capacity_from_log,
    capacity_from_server_info,
    counter_deltas,
    counters_by_rank,
    merge_capacity,
    per_rank_from_deltas,
    rank_counter_snapshot,
    zerodp_capacity_from_log,
)

ZC = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "zerodp_compare.py"))

# What the ours server prints (SGLang's scheduler prefix, our engine's lines, and unrelated noise).
LOG = """\
sgl-sidp: overlay mode=zerodp (batch signal on); model=M, load_format=dummy, dp=2, tp=1; zerodp: source DP0, ...
[2025-11-21 10:00:01 DP0] Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, mem usage=56.9 GB.
[2025-11-21 10:00:02 DP0] sgl-sidp zerodp DP0 TP0: source, serving 96 expert tensors of 48 MoE layers (56.62 GB) from GPU 0
[2025-11-21 10:00:03 DP1] sgl-sidp zerodp DP1 TP0: sink of source DP0 TP0 (GPU 0 -> GPU 1, 650 GB/s measured); offloads w13+w2 of layers [0, 1]: forced. Pulls 2.36 GB per forward (3.6 ms of copies); frees 53.1 GB, slots take 2.36 GB.
[2025-11-21 10:00:04 DP0] sgl-sidp zerodp DP0 TP0: source KV cache 520000 tokens (max_total_num_tokens)
[2025-11-21 10:00:04 DP1] sgl-sidp zerodp DP1 TP0: sink KV cache 1250000 tokens (max_total_num_tokens), 53.10 GB of experts freed for it
[2025-11-21 10:00:05 DP0] max_total_num_tokens=520000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2048, context_len=40960, available_gpu_mem=20.00 GB
[2025-11-21 10:00:05 DP1 TP0] max_total_num_tokens=1250000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2048, context_len=40960, available_gpu_mem=10.00 GB
"""

# /metrics with --enable-metrics and dp 2 (multiprocess collector: no _created samples), plus a tokenizer metric.
METRICS = """\
# HELP sglang:realtime_tokens_total Total number of tokens processed.
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{dp_rank="0",engine_type="unified",mode="decode",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 100.0
sglang:realtime_tokens_total{dp_rank="1",engine_type="unified",mode="decode",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 300.0
sglang:realtime_tokens_total{dp_rank="1",engine_type="unified",mode="prefill_compute",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2048.0
# HELP sglang:forward_execution_seconds_total GPU busy.
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{category="decode",dp_rank="0",model_name="m",tp_rank="0"} 1.5
sglang:forward_execution_seconds_total{category="prefill",dp_rank="0",model_name="m",tp_rank="0"} 0.5
# HELP sglang:generation_tokens_total Generated tokens.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 999.0
"""


def test_capacity_from_log():
    assert capacity_from_log(LOG) == {0: 520000, 1: 1250000}
    assert capacity_from_log("[2025-11-21 10:00:05] max_total_num_tokens=4096, chunked_prefill_size=1") == {0: 4096}
    assert capacity_from_log("nothing yet") == {}
    assert zerodp_capacity_from_log(LOG) == {0: {"role": "source", "kv_tokens": 520000},
                                             1: {"role": "sink", "kv_tokens": 1250000}}


def test_capacity_from_http_answers_and_merge():
    loads = {"loads": [{"dp_rank": 1, "max_total_num_tokens": 11}, {"dp_rank": 0, "max_total_num_tokens": 10}]}
    assert capacity_from_loads(loads) == {0: 10, 1: 11}
    assert capacity_from_loads(None) == {} and capacity_from_loads({"loads": [{"dp_rank": 0}]}) == {}
    info = {"max_total_num_tokens": 10, "internal_states": [{"memory_usage": {"token_capacity": 10}},
                                                            {"memory_usage": {"token_capacity": 12}}]}
    assert capacity_from_server_info(info) == {0: 10, 1: 12}
    assert capacity_from_server_info({"max_total_num_tokens": 7, "internal_states": [{}]}) == {0: 7}
    merged = merge_capacity({"v1_loads": {0: 10}, "log": {0: 99, 1: 20}}, ["v1_loads", "log"])
    assert merged == {0: 10, 1: 20}


def test_prometheus_counters_per_rank_and_deltas():
    assert counters_by_rank(METRICS, "sglang:realtime_tokens_total", "mode") == {
        (0, "decode"): 100.0, (1, "decode"): 300.0, (1, "prefill_compute"): 2048.0}
    assert counters_by_rank(METRICS, "sglang:generation_tokens_total") == {(0, ""): 999.0}  # no dp_rank: rank 0
    before = rank_counter_snapshot(METRICS)
    assert before["sglang:num_retracted_requests_total"] == {}
    after_text = METRICS.replace("} 300.0", "} 1300.0").replace(
        'category="decode",dp_rank="0",model_name="m",tp_rank="0"} 1.5',
        'category="decode",dp_rank="0",model_name="m",tp_rank="0"} 4.0') + (
        '# TYPE sglang:num_retracted_requests_total counter\n'
        'sglang:num_retracted_requests_total{dp_rank="1",tp_rank="0"} 3.0\n')
    deltas = counter_deltas(before, rank_counter_snapshot(after_text))
    assert deltas["sglang:realtime_tokens_total"] == {"1/decode": 1000.0}
    ranks = per_rank_from_deltas(deltas)
    assert ranks[1]["decode_tokens"] == 1000.0 and ranks[1]["retracted"] == 3.0
    assert ranks[0]["busy_s"] == pytest.approx(2.5) and ranks[0]["decode_tokens"] == 0.0
    assert ranks[0]["busy_s_by"] == {"decode": pytest.approx(2.5)} and ranks[1]["busy_s_by"] == {}


def test_gpu_seconds_are_the_replicas_not_the_sum_of_its_tp_ranks():
    """q8_shift_busy_2gpu_h100: SGLang's device timer runs in every TP rank's scheduler, and the sum over TP2's two
    GPUs came out twice the planner's simulated forwards (56 against 28 s)."""
    text = METRICS + (
        'sglang:forward_execution_seconds_total{category="decode",dp_rank="0",model_name="m",tp_rank="1"} 2.5\n'
        'sglang:realtime_tokens_total{dp_rank="0",mode="decode",model_name="m",tp_rank="1"} 7.0\n')
    assert counters_by_rank(text, "sglang:forward_execution_seconds_total", "category") == {
        (0, "decode"): 2.0, (0, "prefill"): 0.5}
    assert counters_by_rank(text, "sglang:realtime_tokens_total", "mode")[(0, "decode")] == 107.0  # summed
    shift = ('sglang:sidp_shift_forwards_total{config="base",dp_rank="0",tp_rank="0"} 68.0\n'
             'sglang:sidp_shift_forwards_total{config="base",dp_rank="0",tp_rank="1"} 68.0\n')
    assert counters_by_rank(shift, "sglang:sidp_shift_forwards_total", "config") == {(0, "base"): 68.0}  # every GPU


def test_the_streams_chunks_carry_the_dp_rank():
    parse = CHUNK_PARSERS["sglang"]
    assert parse({"meta_info": {"dp_rank": 1, "completion_tokens": 2}}, 0).dp_rank == 1
    assert parse({"text": "x"}, 0).dp_rank is None and CHUNK_PARSERS["openai"]({"choices": []}, 0).dp_rank is None


def calls(*argv):
    return ZC["compare_calls"](ZC["parser"]().parse_args(["--model-path", "M", *argv]))


def test_exactness_then_vanilla_and_ours_side_by_side():
    first, timed = calls("--mem-fraction-static", "0.5", "--ours-extra", "--sidp-zerodp-layers all", "--exactness", "6",
                         "--exactness-new-tokens", "16", "--decode-heavy", "64", "--trace-mooncake", "m.jsonl",
                         "--mooncake-duration-s", "60", "--azure-code", "a.csv", "--azure-duration-s", "60",
                         "--mooncake-time-scale", "2", "--azure-time-scale", "2", "--common-extra", "--x 1")
    common = ["--model-path", "M", "--load-format", "dummy", "--gpus", "0,1,2,3", "--out-dir", "zerodp_results",
              "--port", "22000", "--ready-timeout-s", "420",
              "--extra-args=--attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5 --x 1"]
    assert first == [*common, "--configs", "zerodp_dp2_all", "--exact", "--exact-tokens", "16"]
    assert timed == [*common, "--configs", "dp2,zerodp_dp2_all", "--parallel", "--burst", "64+1024+1024",
                     "--trace", "m.jsonl", "--trace-args=--start-s 0 --duration-s 60 --max-context-len 40960 --seed 0 "
                     "--slo-ttft-ms 2000 --slo-tpot-ms 100", "--rates", "0.5", "--trace", "a.csv"]
    only, = calls("--exactness", "0", "--decode-heavy", "4", "--dp-size", "4", "--vanilla-gpus", "4,5,6,7",
                  "--ours-gpus", "0,1,2,3")
    assert only[only.index("--gpus") + 1] == "4,5,6,7,0,1,2,3" and "dp4,zerodp_dp4" in only and "--exact" not in only


@pytest.mark.parametrize("argv,why", [
    (["--ours-extra", "--zerodp-layers every:4"], "only ZeroDP option"), (["--vanilla-extra", "--x 1"], "same flags"),
    (["--trace-mooncake", "m", "--azure-code", "a", "--azure-duration-s", "60"], "unlike the first trace's"),
    (["--exactness", "0"], "nothing to measure")])
def test_what_compare_cannot_run_is_refused(argv, why):
    with pytest.raises(ValueError, match=why):
        calls(*argv)


def test_print_only_prints_both_commands_with_what_is_left_of_the_deadline(capsys):
    assert ZC["main"](["--model-path", "M", "--exactness", "1", "--decode-heavy", "2", "--exactness-top-k", "3",
                       "--deadline-s", "300", "--print-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("zerodp_compare.py: --exactness-top-k ignored: bench.compare compares tokens and their "
                      "logprobs, not top-k sets")
    assert [line.split(" --configs ")[1] for line in out[1:]] == [
        "zerodp_dp2 --exact --exact-tokens 32 --deadline-s 300", "dp2,zerodp_dp2 --parallel --burst 2+1024+1024 "
        "--deadline-s 300"]
