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

    write("dp", {"0": 264513, "1": 264513}, {"1": {"step_ms": 19.0}}, {"768+256": {"output_tok_s": 2000.0}})
    write("tp", {"0": 770642}, {"1": {"step_ms": 15.0}}, {"768+256": {"output_tok_s": 2500.0}})
    write("sidp_was", {"0": 354513, "1": 354513}, {}, {"768+256": {"output_tok_s": 1900.0}})
    (tmp_path / "other.json").write_text("{}")  # not a configuration: ignored
    table = MOD["report"](tmp_path).splitlines()
    assert table[0] == "| config | KV tokens (per rank) | step ms @ B=1 | 768+256 tok/s (vs dp, vs tp) |"
    assert "| sidp_was | 354,513, 354,513 | - | 1,900 (0.95x, 0.76x) |" in table
    assert "| dp | 264,513, 264,513 | 19.0 | 2,000 (1.00x, 0.80x) |" in table
    MOD["plot"](tmp_path)
    assert (tmp_path / "compare.png").stat().st_size > 10_000


def test_unknown_configuration_is_refused_before_any_server(tmp_path):
    with pytest.raises(SystemExit, match="unknown configuration 'dp3'"):
        MOD["main"](["--out-dir", str(tmp_path), "--configs", "dp,dp3"])


def test_crossover_is_the_smallest_batch_where_was_is_no_slower():
    def steps(**ms):
        return {"steps": {k[1:]: {"step_ms": v} for k, v in ms.items()}}

    cross = MOD["crossover_batch"]
    assert cross(steps(b1=30.0, b64=31.0, b256=40.0), steps(b1=21.0, b64=32.0, b256=60.0)) == 64
    assert cross(steps(b1=30.0), steps(b1=20.0)) is None and cross({}, steps(b1=1.0)) is None


def test_auto_needs_b_th_or_the_two_sweeps_before_any_server(tmp_path):
    with pytest.raises(SystemExit, match="sidp_auto needs --b-th or the step sweeps"):
        MOD["main"](["--out-dir", str(tmp_path), "--configs", "dp,sidp_auto"])
    for name, ms in (("sidp_was", 30.0), ("sidp_cas", 20.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"steps": {"8": {"step_ms": ms}}}))
    with pytest.raises(SystemExit, match="WaS is never faster than CaS"):
        MOD["main"](["--out-dir", str(tmp_path), "--configs", "sidp_auto"])


def test_mode_shares_count_forwards_between_two_scrapes():
    def body(was0, cas0, was1, cas1):
        lines = ["# HELP sglang:sidp_sidp_forwards Forwards of this rank by mode.",
                 "# TYPE sglang:sidp_sidp_forwards counter"]
        for dp, was, cas in ((0, was0, cas0), (1, was1, cas1)):
            lines += [f'sglang:sidp_sidp_forwards_total{{dp_rank="{dp}",mode="was"}} {was}',
                      f'sglang:sidp_sidp_forwards_total{{dp_rank="{dp}",mode="cas"}} {cas}']
        return "\n".join(lines) + "\n"

    shares = MOD["mode_shares"](body(1, 1, 1, 1), body(4, 7, 2, 5))
    assert shares == {"cas": 10 / 14, "was": 4 / 14}
    assert MOD["mode_shares"](body(1, 1, 1, 1), body(1, 1, 1, 1)) == {}


def test_configurations_scale_with_dp_and_tp():
    launcher, flags = MOD["CONFIGS"]["dp_attn"]
    assert flags(4, 2) == ["--tp-size", "8", "--dp-size", "4", "--enable-dp-attention"]
    assert MOD["CONFIGS"]["sidp_was_unshifted"][1](8, 1)[-2:] == ["--sidp-fetch-order", "forward"]
    assert MOD["dp_ranks"]("tp", 4) == 1 and MOD["dp_ranks"]("sidp_cas", 4) == 4
