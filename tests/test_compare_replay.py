"""scripts/compare_replay.py: the side-by-side table and ratios (no servers)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_replay.py"
spec = importlib.util.spec_from_file_location("compare_replay", SCRIPT)
compare_replay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_replay)


def summary(out_tps, ttft, hit):
    return {"command": "python -m sgl_sidp.replay ...", "completed": 10, "failed": 0, "output_throughput": out_tps,
            "mean_ttft_ms": ttft, "request_goodput": None, "window": {"requests_sent": 10, "replay_span_s": 5.0},
            "cache_report": {"cache_hit_rate": hit}}


def test_ratios_are_ours_over_vanilla_and_skip_missing():
    table, ratios = compare_replay.compare_table(
        {"azure": {"vanilla": summary(200.0, 400.0, 0.0), "ours": summary(198.0, 420.0, None)}})
    r = ratios["azure"]
    assert r["output_throughput"] == {"vanilla": 200.0, "ours": 198.0, "ratio": 0.99}
    assert r["mean_ttft_ms"]["ratio"] == 1.05
    assert "request_goodput" not in r and "failed" in r and r["failed"]["ratio"] is None
    assert "| output throughput (tok/s) | 200.00 | 198.00 | 0.990 |" in table
    assert "prefix-cache hit rate vanilla 0.0% / ours n/a" in table


def test_job_flags_parse():
    args = compare_replay.parse_args(["--out", "x", "--server-args", "--tp-size 2", "--job", "a=--trace t.csv",
                                      "--job", "b=--trace m.jsonl --time-scale 2"])
    assert [j.split("=", 1)[0] for j in args.job] == ["a", "b"] and args.gpus == "0,1" and not args.sequential
