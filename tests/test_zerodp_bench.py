"""scripts/zerodp_compare.py and its helpers (sgl_sidp.bench.server_stats, per-rank replay stats): the pure parts, on samples
in SGLang 0.5.17's formats. No GPU, no server, no subprocess."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from sgl_sidp.bench.client import CHUNK_PARSERS
from sgl_sidp.bench.metrics import per_rank_stats
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
    zerodp_lines,
)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "zerodp_compare.py"
spec = importlib.util.spec_from_file_location("zerodp_compare", SCRIPT)
zc = importlib.util.module_from_spec(spec)
sys.modules.setdefault("zerodp_compare", zc)  # dataclasses look their module up there
spec.loader.exec_module(zc)

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


def test_capacity_and_zerodp_lines_from_log():
    assert capacity_from_log(LOG) == {0: 520000, 1: 1250000}
    assert capacity_from_log("[2025-11-21 10:00:05] max_total_num_tokens=4096, chunked_prefill_size=1") == {0: 4096}
    assert capacity_from_log("nothing yet") == {}
    lines = zerodp_lines(LOG)
    assert len(lines) == 4 and all("sgl-sidp zerodp" in x for x in lines) and lines[0].startswith("[2025")
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


def test_per_rank_stats_from_rows_and_chunk_rank():
    rows = [
        {"dp_rank": 0, "success": True, "output_len_received": 10, "ttft_ms": 100.0, "tpot_ms": 10.0},
        {"dp_rank": 1, "success": True, "output_len_received": 30, "ttft_ms": 300.0, "tpot_ms": 20.0},
        {"dp_rank": 1, "success": True, "output_len_received": 10, "ttft_ms": 100.0, "tpot_ms": None},
        {"dp_rank": 1, "success": False, "output_len_received": 0, "ttft_ms": None, "tpot_ms": None},
        {"dp_rank": None, "success": False, "output_len_received": 0, "ttft_ms": None, "tpot_ms": None},
    ]
    s = per_rank_stats(rows, duration_s=2.0)
    assert set(s) == {0, 1}
    assert (s[1]["requests"], s[1]["completed"], s[1]["output_tokens"]) == (3, 2, 40)
    assert s[1]["output_throughput"] == 20.0 and s[0]["output_throughput"] == 5.0
    assert s[1]["mean_ttft_ms"] == pytest.approx(200.0) and s[1]["mean_tpot_ms"] == pytest.approx(20.0)
    assert per_rank_stats([{"dp_rank": None}], 1.0) == {}
    parse = CHUNK_PARSERS["sglang"]
    assert parse({"meta_info": {"dp_rank": 1, "completion_tokens": 2}}, 0).dp_rank == 1
    assert parse({"text": "x"}, 0).dp_rank is None and CHUNK_PARSERS["openai"]({"choices": []}, 0).dp_rank is None


def summary(tps, ttft, tpot, duration=10.0):
    return {"output_throughput": tps, "mean_ttft_ms": ttft, "median_ttft_ms": ttft, "p99_ttft_ms": ttft,
            "mean_tpot_ms": tpot, "median_tpot_ms": tpot, "p99_tpot_ms": tpot, "completed": 4, "failed": 0,
            "total_output_tokens": tps * duration, "duration": duration, "window": {"requests_sent": 4},
            "cache_report": {"cache_hit_rate": 0.0}}


def test_side_report_uses_row_ranks_else_prometheus_share():
    deltas = {"sglang:realtime_tokens_total": {"0/decode": 100.0, "1/decode": 300.0}}
    r = zc.side_report(summary(400.0, 50.0, 5.0), [], deltas)
    assert r["per_rank_source"] == "prometheus"
    assert r["ranks"]["0"]["output_throughput"] == pytest.approx(100.0)
    assert r["ranks"]["1"]["output_throughput"] == pytest.approx(300.0)
    rows = [{"dp_rank": 0, "success": True, "output_len_received": 2000, "ttft_ms": 1.0, "tpot_ms": 1.0},
            {"dp_rank": 1, "success": True, "output_len_received": 2000, "ttft_ms": 1.0, "tpot_ms": 1.0}]
    r = zc.side_report(summary(400.0, 50.0, 5.0), rows, deltas)
    assert r["per_rank_source"] == "meta_info.dp_rank"
    assert r["ranks"]["1"]["output_throughput"] == 200.0  # from the rows...
    assert r["ranks"]["1"]["output_throughput_prom"] == pytest.approx(300.0)  # ...the estimate kept beside
    assert zc.side_report(summary(1.0, 1.0, 1.0), [], None)["per_rank_source"] is None


def test_exactness_comparison():
    resp = {"meta_info": {"dp_rank": 1, "output_token_logprobs": [[-0.5, 7, None], [-1.0, 8, None], [-2.0, 9, None]],
                          "output_top_logprobs": [[[-0.5, 7, None], [-3.0, 1, None]], [[-1.0, 8, None]],
                                                  [[-2.0, 9, None]]]}}
    a = zc.parse_generation(resp)
    assert a == {"ids": [7, 8, 9], "logprobs": [-0.5, -1.0, -2.0], "top_ids": [[7, 1], [8], [9]], "dp_rank": 1}
    b = {"ids": [7, 8, 4], "logprobs": [-0.5, -1.25, -2.0], "top_ids": [[1, 7], [8], [4]]}
    c = zc.compare_generations(a, b)
    assert c == {"identical": False, "length": 3, "matched_prefix": 2, "max_abs_logprob_diff": 0.25,
                 "top_k_agree": 2, "top_k_positions": 2}
    same = zc.compare_generations(a, a)
    assert same["identical"] and same["max_abs_logprob_diff"] == 0.0
    s = zc.summarize_pair([c, same])
    assert (s["identical"], s["prompts"], s["matched_tokens"], s["tokens"]) == (1, 2, 5, 6)
    assert s["first_divergence"] == [2, None] and s["max_abs_logprob_diff"] == 0.25
    body = zc.greedy_body([1, 2], 32, 5, 1)
    assert body["routed_dp_rank"] == 1 and body["sampling_params"]["temperature"] == 0.0 and body["top_logprobs_num"] == 5
    assert "routed_dp_rank" not in zc.greedy_body([1], 4, 0, None)
    p = zc.exactness_prompts(3, seed=0)
    assert p == zc.exactness_prompts(3, seed=0) and [len(x) for x in p] == list(zc.EXACTNESS_LENGTHS[:3])
    assert all(100 <= t < 4000 for x in p for t in x)


def test_server_flags_and_workload_plan(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = zc.parse_args(["--model-path", str(model), "--mem-fraction-static", "0.8", "--ours-extra",
                          "--zerodp-layers all", "--vanilla-extra", "--log-level warning",
                          "--decode-heavy", "4", "--trace-mooncake", "m.jsonl", "--mooncake-duration-s", "60",
                          "--out-dir", str(tmp_path / "out")])
    van, ours = zc.server_flags(args, "vanilla"), zc.server_flags(args, "ours")
    assert van[:2] == ["--model-path", str(model)] and "--tokenizer-path" in van  # config-only folder
    for flags in (van, ours):
        assert flags[flags.index("--dp-size") + 1] == "2" and "--enable-metrics" in flags
        assert flags[flags.index("--mem-fraction-static") + 1] == "0.8"
        assert flags[flags.index("--attention-backend") + 1] == "triton"
    assert "--overlay-mode" not in van and van[-2:] == ["--log-level", "warning"]
    assert ours[-4:] == ["--overlay-mode", "zerodp", "--zerodp-layers", "all"]
    (model / "tokenizer.json").write_text("{}")
    assert "--tokenizer-path" not in zc.server_flags(args, "vanilla")

    wls = zc.plan_workloads(args, tmp_path / "out")
    assert [w.name for w in wls] == ["decode_heavy", "mooncake"]
    rows = [json.loads(x) for x in (tmp_path / "out" / "decode_heavy_trace.jsonl").read_text().splitlines()]
    assert rows == [{"timestamp": 0, "input_length": 1024, "output_length": 1024}] * 4
    dh = wls[0].replay_args
    assert dh[dh.index("--max-concurrency") + 1] == "4" and dh[dh.index("--trace-format") + 1] == "shift"
    mc = wls[1].replay_args
    assert mc[mc.index("--duration-s") + 1] == "60" and mc[mc.index("--max-context-len") + 1] == "40960"
    assert "--slo-ttft-ms" in mc


def test_markdown_report_tables():
    deltas = {"sglang:realtime_tokens_total": {"0/decode": 100.0, "1/decode": 300.0}}
    v = zc.side_report(summary(200.0, 50.0, 5.0), [], {"sglang:realtime_tokens_total": {"0/decode": 1.0,
                                                                                            "1/decode": 1.0}})
    o = zc.side_report(summary(400.0, 40.0, 6.0), [], deltas)
    wl = {"status": "ok", "description": "4 requests", "wall_s": 12.0, "errors": {}, "vanilla": v, "ours": o}
    wl["ratios"] = zc.workload_ratios(wl)
    assert wl["ratios"]["output_throughput"] == 2.0 and wl["ratios"]["DP1 output_throughput"] == pytest.approx(3.0)
    report = {
        "command": "python scripts/zerodp_compare.py ...", "started_at": "now", "status": "ok", "wall_s": 100,
        "servers": {"vanilla": {"gpus": "0,1", "ready_s": 60, "command": "v", "kv_tokens": {"0": 500000, "1": 500000},
                                "settings": {"load_balance_method": "round_robin"}, "zerodp_lines": [],
                                "capacity_sources": {"log": {"0": 500000, "1": 500000}}},
                    "ours": {"gpus": "2,3", "ready_s": 90, "command": "o", "kv_tokens": {"0": 500000, "1": 1250000},
                             "settings": {"load_balance_method": "total_tokens"},
                             "zerodp_lines": zerodp_lines(LOG), "capacity_sources": {}}},
        "exactness": {"new_tokens": 32, "top_k": 5, "prompts": [{"errors": {}}],
                      "pairs": {"sink_vs_vanilla": {"prompts": 1, "identical": 1, "matched_tokens": 32, "tokens": 32,
                                                    "first_divergence": [None], "max_abs_logprob_diff": 0.0,
                                                    "top_k_agree": 32, "top_k_positions": 32}}},
        "workloads": {"decode_heavy": wl, "azure_code": {"status": "skipped", "reason": "deadline: would start ..."}},
        "errors": [],
    }
    md = zc.render_markdown(report)
    assert "| DP1 (ours: sink) | 500,000 | 1,250,000 | 2.500 |" in md
    assert "| all ranks | 1,000,000 | 1,750,000 | 1.750 |" in md
    assert "| output tok/s, all ranks | 200.00 | 400.00 | 2.000 |" in md
    assert "| output tok/s, DP1 (ours: sink) | 100.00 | 300.00 | 3.000 |" in md
    assert "| mean TPOT (ms) | 5.00 | 6.00 | 1.200 |" in md
    assert "| ours sink (DP1) vs vanilla DP0 | 1/1 | 32/32 | = | 0 | 32/32 |" in md
    assert "Skipped: deadline: would start" in md and "round_robin" in md and "total_tokens" in md
    assert "sgl-sidp zerodp DP1 TP0: sink KV cache 1250000 tokens" in md
    assert zc.fmt(None) == "-" and zc.fmt(1234567) == "1,234,567" and zc.fmt(0.5) == "0.50"
    assert zc.fmt_ratio(None) == "-" and zc.ratio(1.0, 0) is None and zc.ratio(None, 1.0) is None


def test_skip_reason_deadline_and_dead_server():
    class Proc:
        def __init__(self, rc):
            self.rc = rc

        def poll(self):
            return self.rc

    class Srv:
        def __init__(self, rc):
            self.proc = Proc(rc)

    alive = {"vanilla": Srv(None), "ours": Srv(None)}
    assert zc.skip_reason(105.0, 100.0, None, alive) is None
    assert zc.skip_reason(105.0, 100.0, 10.0, alive) is None
    assert zc.skip_reason(111.0, 100.0, 10.0, alive).startswith("deadline: would start 11 s after")
    assert "ours server exited with 1" in zc.skip_reason(105.0, 100.0, None, {"vanilla": Srv(None), "ours": Srv(1)})
