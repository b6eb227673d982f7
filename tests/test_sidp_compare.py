"""scripts/sidp_compare.py: request counts, rank pinning and the merged report (no servers)."""

import json
import runpy
from pathlib import Path

import pytest

MOD = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts/sidp_compare.py"))


def test_job_requests_fill_the_kv_cache_within_the_cap():
    jr = MOD["job_requests"]
    assert jr(529_026, 768, 256, 2000) == 620  # ceil(1.2 * 529,026 / 1,024)
    assert jr(529_026, 128, 64, 2000) == 2000 and jr(10, 768, 256, 2000) == 1 and jr(1, 1, 1, 9, fixed=5) == 5


def test_spread_pins_round_robin_and_prompts_are_seeded():
    assert MOD["spread"](5, 2) == [0, 1, 0, 1, 0] and MOD["spread"](3, 1) == [None] * 3
    p = MOD["prompts"](3, 7, seed=1)
    assert len(p) == 3 and all(len(x) == 7 and min(x) >= 3 and max(x) < 4000 for x in p)
    assert p == MOD["prompts"](3, 7, seed=1) and p != MOD["prompts"](3, 7, seed=2)


def test_report_merges_configurations_with_ratios(tmp_path):
    def write(name, kv, steps, jobs):
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": name, "kv_tokens": kv, "steps": steps, "jobs": jobs}))

    write("dp2", {"0": 264513, "1": 264513}, {"1": {"step_ms": 19.0}}, {"768+256": {"output_tok_s": 2000.0}})
    write("tp2", {"0": 770642}, {"1": {"step_ms": 15.0}}, {"768+256": {"output_tok_s": 2500.0}})
    write("sidp_was", {"0": 354513, "1": 354513}, {}, {"768+256": {"output_tok_s": 1900.0}})
    (tmp_path / "other.json").write_text("{}")  # not a configuration: ignored
    table = MOD["report"](tmp_path).splitlines()
    assert table[0] == "| config | KV tokens (per rank) | step ms @ B=1 | 768+256 tok/s (vs dp2, vs tp2) |"
    assert "| sidp_was | 354,513, 354,513 | - | 1,900 (0.95x, 0.76x) |" in table
    assert "| dp2 | 264,513, 264,513 | 19.0 | 2,000 (1.00x, 0.80x) |" in table


def test_unknown_configuration_is_refused_before_any_server(tmp_path):
    with pytest.raises(SystemExit, match="unknown configuration 'dp3'"):
        MOD["main"](["--out-dir", str(tmp_path), "--configs", "dp2,dp3"])
