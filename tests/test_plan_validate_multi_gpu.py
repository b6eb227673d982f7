"""`python -m sgl_sidp.bench.validate` (scripts/plan_validate_multi_gpu.py) reads both kinds of results:
`python -m sgl_sidp.bench.compare`'s (`OUT/<model>/<configuration>.json`) and the retired shift_compare.py's
committed ones, into the same measured numbers, so the planner's predictions stand beside either."""

import json
from pathlib import Path

import pytest

from sgl_sidp.bench import validate

ROOT = Path(__file__).resolve().parents[1]
MOD = vars(validate)
OLD = ROOT / "benchmarks/results/plan_multi_gpu/qwen3_8b_2xh200"
QWEN3_8B = ROOT.parent / "shared/models/Qwen3-8B"


def as_compare(folder: Path) -> Path:
    """The committed shift_compare.py results of OLD written as bench.compare writes its own (and a tp1 reference, a
    configuration with options and one refused at launch, which the script leaves out or counts apart)."""
    folder.mkdir()
    names = {"tp": ("tp2", 1, 2), "dp": ("dp2", 2, 1), "dp_attn": ("dp2_attn", 2, 1), "shift": ("shift_sp2_tp1", 1, 1)}
    for old, (name, dp, tp) in names.items():
        r = json.loads((OLD / f"{old}.json").read_text())
        b = r["burst"]
        kv = {str(i): v for i, v in enumerate(r["kv_tokens"][:dp])}
        (folder / f"{name}.json").write_text(json.dumps({
            "config": name, "base_name": name, "dp": dp, "tp": tp, "gpu_count": 2, "kv_tokens": kv,
            "burst": {"spec": "512+2048+256", "total_tok_s": b["total_tok_s"], "ttft_ms_p50": b["median_ttft_ms"],
                      "tpot_ms_p50": b["median_tpot_ms"]}}))
    (folder / "tp1.json").write_text(json.dumps({"config": "tp1", "base_name": "tp1", "gpu_count": 1,
                                                 "kv_tokens": {"0": 803502}}))
    (folder / "shift_sp2_tp1_th1.json").write_text(json.dumps({"config": "shift_sp2_tp1_th1", "base_name": "shift_sp2_tp1",
                                                              "gpu_count": 2, "kv_tokens": {"0": 1}}))
    (folder / "sidp_dp2_was.json").write_text(json.dumps({"config": "sidp_dp2_was", "base_name": "sidp_dp2_was",
                                                         "gpu_count": 2, "refused": "sgl-sidp: error: ..."}))
    (folder / "config.json").write_text("{}")
    return folder


def test_both_kinds_of_results_give_the_same_measured_numbers(tmp_path):
    old, new = MOD["load"](OLD), MOD["load"](as_compare(tmp_path / "Qwen3-8B"))
    assert list(old) == [2] and sorted(new) == [1, 2] and list(new[1]) == ["tp1"]
    assert sorted(old[2]) == ["dp2", "dp2_attn", "shift_sp2_tp1", "tp2"]
    assert sorted(new[2]) == sorted([*old[2], "shift_sp2_tp1_th1"])  # with options: predicted by name where modelled
    for name in old[2]:
        assert old[2][name]["burst"] == new[2][name]["burst"]
        assert new[2][name]["burst"]["shape"] == (512, 2048, 256)
    assert old[2]["dp2"]["kv"] == ("KV tokens of one rank's pool", 2, 803502)
    assert new[2]["dp2"]["kv"] == ("KV tokens, all ranks", 1, 2 * 803502) and new[2]["dp2"]["ttft_ms"] == {}
    assert old[2]["tp2"]["ttft_ms"] == json.loads((OLD / "tp.json").read_text())["ttft_ms"]
    assert MOD["load"](tmp_path) == {}


def test_the_predictions_beside_either_are_the_same(tmp_path, capsys):
    if not QWEN3_8B.is_dir():
        pytest.skip(f"{QWEN3_8B} missing (../shared/models)")
    MOD["main"]([str(OLD), "--model-path", str(QWEN3_8B)])
    old = capsys.readouterr().out
    MOD["main"]([str(as_compare(tmp_path / "Qwen3-8B")), "--model-path", str(QWEN3_8B)])
    new = capsys.readouterr().out
    burst = [line for line in old.splitlines() if "burst of 512" in line]
    assert len(burst) == 12 and all(line in new for line in burst)
    assert "\n## 1 GPU\n" in new and "\n## 2 GPUs\n" in new and "| tp1 | KV tokens, all ranks | tokens |" in new
    assert old.splitlines()[-2:] == new.splitlines()[-2:]  # the rankings


def test_replays_are_predicted_from_the_command_that_ran_them(tmp_path):
    """`replay_settings` reads each compare command of OUT/commands.txt: its trace, rates, replay arguments and
    objectives, keyed as compare keys its results; `sim.goodput` counts the requests that met both objectives per
    second of the makespan (a one-token request has no TPOT)."""
    from sgl_sidp.bench.metrics import SLO
    from sgl_sidp.plan.sim import SimRequest, goodput

    (tmp_path / "Qwen3-8B").mkdir()
    (tmp_path / "commands.txt").write_text(
        "2026-11-26T18:07:06+00:00 commit 21f677e: python -m sgl_sidp.bench.compare --model-path m --gpus 0,1 "
        "--configs tp2,dp2 --trace .gpu/traces/AzureLLMInferenceTrace_code.csv --rates 2,4 "
        "--trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 50 --out-dir o\n")
    got = MOD["replay_settings"](tmp_path / "Qwen3-8B")
    assert got["AzureLLMInferenceTrace_code@2x"] == (
        "--trace=.gpu/traces/AzureLLMInferenceTrace_code.csv --time-scale=0.5 --duration-s 300 --compress-gaps-s 5",
        (1000.0, 50.0))
    assert sorted(got) == ["AzureLLMInferenceTrace_code@2x", "AzureLLMInferenceTrace_code@4x"]

    def req(arrival, first, finish, out):
        r = SimRequest(arrival, 16, out)
        r.first_token_s, r.finish_s = first, finish
        return r

    reqs = [req(0.0, 0.5, 1.0, 11),   # TTFT 500 ms, TPOT 50 ms: good
            req(1.0, 2.5, 3.0, 11),   # TTFT 1,500 ms: not
            req(2.0, 2.1, 4.0, 2),    # TPOT 1,900 ms: not
            req(3.0, 3.2, 3.2, 1)]    # one token: TTFT alone decides
    assert goodput(reqs, SLO(ttft_ms=1000.0, tpot_ms=50.0)) == {"good_requests": 2, "request_goodput": 2 / 4.0}


def test_profiled_forwards_stand_beside_the_planners_steps(tmp_path):
    """`compare --profile 16+2048+8`'s forwards: a prefill forward holds the prompts SGLang's chunk takes from a
    replica's share (8,192 / 2,048 = 4 of DP2's 8), a decode step that share; each beside the planner's step for the
    same forward, the slowest replica's first GPU as measured; DP attention's decode (ranks in lockstep: waits in
    its span) left out."""
    if not QWEN3_8B.is_dir():
        pytest.skip(f"{QWEN3_8B} missing (../shared/models)")
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.plan.comm import Interconnect
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import step_model
    from sgl_sidp.plan.steps import GPUS, host_time_alone_ms

    def stage(ms):
        return {"counted": True, "span_ms": ms}

    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    for name, dp, ranks in [("dp2", 2, {"TP-0-DP-0": (180.0, 11.0), "TP-0-DP-1": (215.0, 10.0)}),
                            ("dp2_attn", 2, {"TP-0-DP-0": (200.0, 30.0), "TP-0-DP-1": (190.0, 25.0)})]:
        (folder / f"{name}.json").write_text(json.dumps({
            "config": name, "dp": dp, "gpu_count": 2, "kv_tokens": {"0": 1000, "1": 1000},
            "profile": {"spec": "16+2048+8", "chunked_prefill_size": 8192,
                        "ranks": {g: {"prefill": stage(p), "decode": stage(d)} for g, (p, d) in ranks.items()}}}))
    got = {(r[0], r[1].split(",")[0]): r for r in MOD["profile_rows"](folder, str(QWEN3_8B), "H100")}
    assert sorted(got) == [("dp2", "profiled decode step"), ("dp2", "profiled prefill forward"),
                           ("dp2_attn", "profiled prefill forward")]
    hf, gpu = read_hf_config(str(QWEN3_8B)), "H100"
    model = step_model(configuration_named("dp2"), hf, gpu, Interconnect.load(GPUS[gpu]["name"]), 2052,
                       host_time_alone_ms(GPUS[gpu]["name"]))[0]
    prefill = got["dp2", "profiled prefill forward"]
    assert "4 x 2,048 tokens" in prefill[1] and prefill[3:] == (model.prefill_ms([(2048, 0)] * 4), 215.0)
    assert got["dp2", "profiled decode step"][3:] == (model.decode_ms(8, 2048), 11.0)
    # a Shift server profiled before its exchanges were overlapped, at its own threshold: named and priced as it ran
    # (`compare_report.ran_as`), as `load` names its burst, so the row reaches the run's table
    (folder / "shift_sp2_tp1.json").write_text(json.dumps({
        "config": "shift_sp2_tp1", "technique": "shift", "dp": 1, "gpu_count": 2, "kv_tokens": {"0": 1000},
        "shift_threshold": 1024,
        "profile": {"spec": "16+2048+8", "chunked_prefill_size": 8192,
                    "ranks": {"TP-0": {"prefill": stage(120.0), "decode": stage(9.0)}}}}))
    got = {(r[0], r[1].split(",")[0]): r for r in MOD["profile_rows"](folder, str(QWEN3_8B), "H100")}
    nccl = step_model(configuration_named("shift_sp2_tp1_nccl_th1024"), hf, gpu, Interconnect.load(GPUS[gpu]["name"]),
                      2052, host_time_alone_ms(GPUS[gpu]["name"]))[0]
    assert got["shift_sp2_tp1_nccl_th1024", "profiled prefill forward"][3:] == (nccl.prefill_ms([(2048, 0)] * 4), 120.0)
    # traced with the host (--profile-host): the tracer slows the host, so its decode step is left out
    r = json.loads((folder / "dp2.json").read_text())
    (folder / "dp2.json").write_text(json.dumps(r | {"profile": r["profile"] | {"host": "calls"}}))
    got = {(r[0], r[1].split(",")[0]) for r in MOD["profile_rows"](folder, str(QWEN3_8B), "H100")}
    assert ("dp2", "profiled decode step") not in got and ("dp2", "profiled prefill forward") in got


def test_a_prompt_longer_than_the_chunk_is_profiled_chunk_by_chunk(tmp_path):
    """`compare --profile 16+8192+6` on DP attention with SGLang's 4,096-token chunk traced the first prompt's two
    chunks, then the second's (0, 4,096, 0, 4,096 tokens in the KV before each): the row is the mean of the
    planner's steps for those forwards, not four fresh chunks (on 2 x H200 that read -21.9 % where the mean is
    +5.8 %, `q30_dpattn_profile_2gpu_h200`)."""
    if not QWEN3_8B.is_dir():
        pytest.skip(f"{QWEN3_8B} missing (../shared/models)")
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.plan.comm import Interconnect
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import step_model
    from sgl_sidp.plan.steps import GPUS, host_time_alone_ms

    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "dp2_attn.json").write_text(json.dumps({
        "config": "dp2_attn", "dp": 2, "gpu_count": 2, "kv_tokens": {"0": 1000, "1": 1000},
        "profile": {"spec": "16+8192+6", "steps": 4, "chunked_prefill_size": 4096,
                    "ranks": {"TP-0-DP-0": {"prefill": {"counted": True, "span_ms": 140.0}}}}}))
    [row] = MOD["profile_rows"](folder, str(QWEN3_8B), "H100")
    model = step_model(configuration_named("dp2_attn"), read_hf_config(str(QWEN3_8B)), "H100",
                       Interconnect.load(GPUS["H100"]["name"]), 8195, host_time_alone_ms(GPUS["H100"]["name"]))[0]
    assert "mean of 4: chunks of 4,096 tokens after 0, 4,096, 0, 4,096 in the KV" in row[1]
    assert row[3] == pytest.approx((model.prefill_ms([(4096, 0)]) + model.prefill_ms([(4096, 4096)])) / 2)
    assert model.prefill_ms([(4096, 4096)]) > model.prefill_ms([(4096, 0)])


def test_a_replayed_trace_not_found_is_one_line_before_any_prediction(tmp_path, capsys):
    (tmp_path / "Qwen3-8B").mkdir()
    (tmp_path / "Qwen3-8B" / "dp2.json").write_text(json.dumps({"config": "dp2", "dp": 2, "gpu_count": 2,
                                                                "kv_tokens": {"0": 1, "1": 1}}))
    (tmp_path / "commands.txt").write_text(
        "2026-11-27T12:47:12+00:00 commit eb46fda: python -m sgl_sidp.bench.compare --model-path m --gpus 0,1 "
        "--configs dp2 --trace .gpu/traces/mooncake_head400.jsonl --out-dir o\n")
    with pytest.raises(SystemExit) as e:
        MOD["main"]([str(tmp_path / "Qwen3-8B"), "--model-path", "m", "--trace-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{tmp_path}/mooncake_head400.jsonl: the trace a replay here sent is not there" in err


def test_a_one_output_burst_has_no_tpot_row(capsys):
    """A prefill-only burst (1 output token: no TPOT, measured 0) is held against its throughput and TTFT only."""
    q32 = ROOT.parent / "shared/models/Qwen3-32B"
    if not q32.is_dir():
        pytest.skip(f"{q32} missing (../shared/models)")
    MOD["main"]([str(ROOT / "benchmarks/results/multi_gpu/q32_prefill_only_2gpu_h100/Qwen3-32B"),
                 "--model-path", str(q32), "--gpu", "H100"])
    out = capsys.readouterr().out
    assert "(4096 in, 1 out): total throughput" in out and "(4096 in, 1 out): TTFT p50" in out
    assert "TPOT" not in out


def test_a_goodput_measured_at_zero_has_no_ratio():
    """No request met the objective (DP attention on the H100 Mooncake window): a row, not a ZeroDivisionError."""
    assert validate.error_text(0.0808, 0.0861) == "-6.2%"
    assert validate.error_text(0.0, 0.0) == "both 0" and validate.error_text(0.06, 0.0) == "measured 0"


def test_per_request_lines_set_each_measured_request_beside_its_simulated_one(tmp_path):
    """`measured_requests` reads a replay's requests as compare keeps them (plain or .gz, any order); `schedule_lines`
    sets them beside the simulated schedule: the ends of prefill and of the replay, the first TTFT (the simulated one
    from the request's target send time), the medians, and the first requests one by one."""
    import gzip

    rows = [{"id": 1, "actual_send_s": 0.5, "target_send_s": 0.5, "input_len": 100, "ttft_ms": 200.0, "e2e_ms": 700.0},
            {"id": 0, "actual_send_s": 0.0, "target_send_s": 0.0, "input_len": 4808, "ttft_ms": 800.0, "e2e_ms": 1000.0}]
    folder = tmp_path / "traces" / "tp2" / "trace_2x"
    folder.mkdir(parents=True)
    with gzip.open(folder / "requests.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    got = validate.measured_requests(tmp_path, "tp2", "trace@2x")
    assert [r["id"] for r in got] == [0, 1]
    assert validate.measured_requests(tmp_path, "dp2", "trace@2x") is None
    lines = validate.schedule_lines(got, ((0.4, 0.9), (0.6, 1.1)), first=1)
    assert lines[2] == "| last prompt's first token (s) | 0.80 | 0.60 |"
    assert lines[3] == "| last token (s) | 1.20 | 1.10 |"
    assert lines[4] == "| first request's TTFT (ms) | 800 | 400 |"
    assert lines[5] == "| TTFT p50 (ms) | 500 | 250 |"
    assert lines[6] == "| decode window p50, first to last token (ms) | 350 | 500 |"
    assert lines[-1] == "| 0 | 0.00 | 4,808 | 0.80 | 0.40 | 1.00 | 0.90 |"
    assert lines[8:11] == ["| arrived (s) | requests | first token, measured - simulated (s, p50) | decode window, "
                           "measured (s, p50) | simulated |", "|---|---:|---:|---:|---:|",
                           "| 0-10 | 2 | +0.25 | 0.35 | 0.50 |"]  # late 0.4 and 0.1; windows 0.2, 0.5 / 0.5, 0.5
    no_list = validate.schedule_lines(got, ((0.4, 0.9), (0.6, 1.1)), first=0)
    assert no_list[-5] == "| 0-10 | 2 | +0.25 | 0.35 | 0.50 |"
    assert no_list[-2:] == ["|---|---:|---:|---:|", "| 0-5 | 4,908 | 4,908 | +0 |"]  # both first tokens within 0-5 s
    # prompts counted by when their first token came: the simulation 2,000 tokens ahead after 0-5 s, even after 5-10 s
    assert validate.prefill_rate_lines([2000, 3000, 500], [6.0, 7.0, 11.0], [4.0, 7.5, 10.5])[2:] == [
        "| 0-5 | 0 | 2,000 | +2,000 |", "| 5-10 | 5,000 | 3,000 | +0 |", "| 10-15 | 500 | 500 | +0 |"]
    assert validate.prefill_rate_lines([100], [0.4], [1.6], width_s=1.0)[2:] == ["| 0-1 | 100 | 0 | -100 |",
                                                                                 "| 1-2 | 0 | 100 | +0 |"]
    assert validate.window_lines([0.0, 12.0], [1.0, 13.0], [2.0, 15.0], ((0.5, 1.5), (12.5, 13.0)))[2:] == [
        "| 0-10 | 1 | +0.50 | 1.00 | 1.00 |", "| 10-20 | 1 | +0.50 | 2.00 | 0.50 |"]
    with pytest.raises(ValueError, match="2 requests measured, 1 simulated"):
        validate.schedule_lines(got, ((0.4, 0.9),))
    trace = {"per_rank": {"0": {"busy_s_by": {"extend": 1.5, "decode": 2.0}}, "1": {"busy_s_by": {"extend": 0.5}}}}
    busy = validate.busy_pair(trace, [{"extend": 1.0, "decode": 1.0}, {"extend": 0.25, "decode": 0.5}])
    assert busy == ({"extend": 2.0, "decode": 2.0}, {"extend": 1.25, "decode": 1.5})
    assert validate.busy_pair({"per_rank": {"0": {"busy_s_by": {}}}}, [{"extend": 1.0}]) is None  # no device timer
    assert validate.busy_pair(trace, None) is None  # replicas in lockstep: not simulated apart
    lines = validate.schedule_lines(got, ((0.4, 0.9), (0.6, 1.1)), first=1, busy=busy)
    assert lines[7:9] == ["| GPU time of the prefill forwards, all replicas (s) | 2.00 | 1.25 |",
                          "| GPU time of the decode forwards, all replicas (s) | 2.00 | 1.50 |"]


@pytest.mark.skipif(not QWEN3_8B.is_dir(), reason="needs ../shared/models/Qwen3-8B")
def test_plan_requests_keeps_each_requests_simulated_times_when_asked():
    """`keep_schedule` gives each predicted row the (first token, last token) of every request in the order given
    (what `--per-request` compares); without it, no row carries one."""
    from sgl_sidp.plan.planner import plan_requests
    from sgl_sidp.plan.sim import SimRequest

    reqs = [SimRequest(0.0, 2048, 8), SimRequest(0.01, 512, 4)]
    rows = plan_requests(str(QWEN3_8B), 2, "H200", "two", reqs, names=["tp2"], keep_schedule=True)["configurations"]
    tp2 = next(r for r in rows if r.name == "tp2")
    assert len(tp2.schedule) == 2 and all(0 < f < l for f, l in tp2.schedule)
    assert tp2.schedule[0][0] < tp2.schedule[1][0]  # the first request is prefilled first
    plain = plan_requests(str(QWEN3_8B), 2, "H200", "two", reqs, names=["tp2"])["configurations"]
    assert all(r.schedule is None for r in plain)
    # the forwards' time, apart from the wait for the second request: it arrives 5 s later, after an idle spell
    late = [SimRequest(0.0, 2048, 8), SimRequest(5.0, 512, 4)]
    row = next(r for r in plan_requests(str(QWEN3_8B), 2, "H200", "late", late, names=["tp2"],
                                        keep_schedule=True)["configurations"] if r.name == "tp2")
    (busy,) = row.busy_s
    prefills = sum(row.prefill_ms[str(t)] for t in (2048, 512)) / 1e3  # the two prompts' forwards (ms, rounded)
    assert busy["extend"] == pytest.approx(prefills, rel=1e-3) and 0 < busy["decode"] < 0.5
    assert busy["extend"] + busy["decode"] < 1.0 < 5.0 < row.schedule[1][1]


def test_a_shift_server_is_predicted_at_the_threshold_it_ran(tmp_path):
    """A Shift server's start-up calibration picks its own threshold (2,048 tokens where the planner put 512-1,024):
    validated as it ran (`_thN`, from the result's "shift_threshold" or, for results kept before that field, the
    server's log), under its folders' name for the per-request files; an infinite one (never the base) keeps the
    planner's name."""
    import gzip

    from sgl_sidp.bench.compare_report import ran_as

    folder = tmp_path / "Qwen3-8B"
    (folder / "logs").mkdir(parents=True)
    base = {"technique": "shift", "gpu_count": 2, "kv_tokens": {"0": 5}}
    with gzip.open(folder / "logs" / "shift_sp2_tp1.log.gz", "wt") as f:
        f.write("[2026-11-27 12:40:48 TP0] sgl-sidp shift TP0: ready; P=2, base SP=2 TP=1 above 2048 tokens per forward "
                "(start-up calibration (0.4 s, dummy prefill bodies, before the prefill graphs))\n")
    # results before "shift_exchange" exchanged by NCCL (`_nccl`), but those named `_overlap`
    assert ran_as({**base, "config": "shift_sp2_tp1"}, folder) == "shift_sp2_tp1_nccl_th2048"
    assert ran_as({**base, "config": "shift_sp2_tp1", "shift_threshold": 512}, folder) == "shift_sp2_tp1_nccl_th512"
    assert ran_as({**base, "config": "shift_sp2_tp1", "shift_threshold": "inf"}, folder) == "shift_sp2_tp1_nccl"
    assert ran_as({**base, "config": "shift_sp2_tp1_th1", "shift_threshold": 1}, folder) == "shift_sp2_tp1_th1_nccl"
    assert ran_as({**base, "config": "shift_sp2_tp1_overlap", "shift_threshold": 512}) == "shift_sp2_tp1_overlap_th512"
    overlap = {**base, "shift_exchange": "overlap", "shift_threshold": 512}
    assert ran_as({**overlap, "config": "shift_sp2_tp1"}) == "shift_sp2_tp1_th512"
    assert ran_as({**overlap, "config": "shift_sp2_tp1", "shift_exchange": "nccl"}) == "shift_sp2_tp1_nccl_th512"
    assert ran_as({"technique": "vanilla", "config": "tp2"}, folder) == "tp2"
    (folder / "shift_sp2_tp1.json").write_text(json.dumps({**base, "config": "shift_sp2_tp1", "shift_threshold": 1024}))
    measured = MOD["load"](folder)[2]
    assert list(measured) == ["shift_sp2_tp1_nccl_th1024"]
    assert measured["shift_sp2_tp1_nccl_th1024"]["config"] == "shift_sp2_tp1"


def results_folder(folder: Path, *results: dict) -> Path:
    """`folder` with each of `results` as bench.compare writes it (<config>.json)."""
    folder.mkdir()
    for r in results:
        (folder / f"{r['config']}.json").write_text(json.dumps(r))
    return folder


def test_a_mode_that_declined_is_predicted_as_what_it_started(tmp_path):
    """`compare_report.predicted_as`: a ZeroDP server predicted to gain nothing starts SGLang's DP (its result's
    "declined_to") and is predicted as that, with SGLang's round robin, under its own name; beside a DP2 of the same
    run both get DP2's row, and a winner named either way is the same server's (`goals.checks`)."""
    from sgl_sidp.bench import goals
    from sgl_sidp.bench.compare_report import predicted_as, predicted_by_flags

    declined = {"config": "zerodp_dp2_kv14459", "technique": "zerodp", "gpu_count": 2, "kv_tokens": {"0": 5, "1": 5},
                "declined_to": "dp2"}
    folder = results_folder(tmp_path / "Qwen3-30B-A3B", declined,
                            {"config": "dp2", "technique": "vanilla", "gpu_count": 2, "kv_tokens": {"0": 5, "1": 5}})
    assert predicted_as(declined) == "dp2" and predicted_as({"config": "tp2", "technique": "vanilla"}) == "tp2"
    measured = MOD["load"](folder)[2]
    assert {k: m["predict_as"] for k, m in measured.items()} == {"dp2": "dp2", "zerodp_dp2_kv14459": "dp2"}
    asked = []

    class Row:
        def __init__(self, name):
            self.name = name

    def predict(group, server):
        asked.append(group)
        return [Row(n) for n in group]

    got = MOD["predicted_by_server"](measured, list(measured), predict)
    assert asked == [["dp2"]] and {k: r.name for k, r in got.items()} == {"dp2": "dp2", "zerodp_dp2_kv14459": "dp2"}
    assert predicted_by_flags(["tp2"], {}, predict)["tp2"].name == "tp2"
    table = [(n, "A@1x: goodput (TTFT 2000 ms, TPOT 100 ms)", "req/s", 0.71, m)
             for n, m in (("dp2", 0.76), ("zerodp_dp2_kv14459", 0.82))]
    (winner,) = [c for c in goals.checks("2 x H200", "run/M", table, {"zerodp_dp2_kv14459": "dp2"})
                 if c.number == "winner"]
    assert winner.ok and not [c for c in goals.checks("2 x H200", "run/M", table) if c.number == "winner"][0].ok


def test_an_auto_server_is_validated_as_the_configuration_it_started(tmp_path):
    """`validate.started_as`: an `--overlay-mode auto` server stands for the configuration it started (its result's
    "auto_choice"), under its folders' name "auto" for the per-request files, unless the run also ran that
    configuration alone; an auto server that does not say what it started is left out."""
    auto = {"config": "auto", "technique": "auto", "gpu_count": 4, "kv_tokens": {"0": 5, "1": 5},
            "auto_choice": "sidp_dp4_auto"}
    folder = results_folder(tmp_path / "Llama-3.1-70B", auto,
                            {"config": "tp2_dp2", "technique": "vanilla", "gpu_count": 4, "kv_tokens": {"0": 7, "1": 7}})
    measured = MOD["load"](folder)[4]
    assert sorted(measured) == ["sidp_dp4_auto", "tp2_dp2"] and measured["sidp_dp4_auto"]["config"] == "auto"
    assert measured["sidp_dp4_auto"]["kv"][2] == 10
    (folder / "auto.json").write_text(json.dumps({**auto, "auto_choice": "tp2_dp2"}))  # ran alone too: that one
    assert list(MOD["load"](folder)[4]) == ["tp2_dp2"]
    (folder / "auto.json").write_text(json.dumps({**auto, "auto_choice": None}))
    assert list(MOD["load"](folder)[4]) == ["tp2_dp2"]
    assert validate.started_as({**auto, "auto_choice": "shift_sp2_tp2"})["technique"] == "shift"


def test_burst_lines_set_the_quantiles_of_first_and_last_tokens_side_by_side():
    """`burst_lines`: a burst's requests as compare keeps them (`bursts/<configuration>.jsonl.gz`) against the
    simulated schedule, by quantile (the server's router and the simulation give the requests replicas in different
    orders), and how long the client took to send them."""
    rows = [{"send_ms": 0.0, "ttft_ms": 100.0, "e2e_ms": 300.0}, {"send_ms": 20.0, "ttft_ms": 480.0, "e2e_ms": 780.0}]
    lines = validate.burst_lines(rows, ((0.1, 0.3), (0.3, 0.6)))
    assert lines[0].startswith("| quantile of the requests | first token, measured (s)")
    assert lines[4] == "| 50% | 0.30 | 0.20 | 0.55 | 0.45 |" and lines[-2] == "| 100% | 0.50 | 0.30 | 0.80 | 0.60 |"
    assert lines[-1] == "\nThe client sent them within 20 ms (the simulation: at once, the first alone)."
    with pytest.raises(ValueError, match="2 requests measured, 1 simulated"):
        validate.burst_lines(rows, ((0.1, 0.3),))


@pytest.mark.skipif(not QWEN3_8B.is_dir(), reason="needs ../shared/models/Qwen3-8B")
def test_per_request_reads_the_bursts_compare_kept(tmp_path):
    """`burst_requests` finds each configuration's kept burst and predicts the same burst's schedule; a configuration
    without a kept burst (runs before 2026-11-28) has no section."""
    import gzip

    (tmp_path / "bursts").mkdir()
    with gzip.open(tmp_path / "bursts" / "tp2.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({"send_ms": float(i), "ttft_ms": 50.0 * (i + 1), "e2e_ms": 400.0 + 50 * i}) + "\n"
                        for i in range(4)))
    measured = {"tp2": {"config": "tp2", "burst": {"shape": (4, 512, 8)}},
                "dp2": {"config": "dp2", "burst": {"shape": (4, 512, 8)}}}
    lines = validate.burst_requests(tmp_path, measured, str(QWEN3_8B), "H100", 2)
    assert lines[1] == "### tp2, burst 4 x (512 in, 8 out)" and sum(ln.startswith("| 50% |") for ln in lines) == 1
    assert validate.burst_requests(tmp_path, {"dp2": measured["dp2"]}, str(QWEN3_8B), "H100", 2) == []


def test_a_server_started_with_a_switch_the_planner_does_not_model_is_left_out_and_named(tmp_path):
    """`validate.unmodelled`: `bench.compare` records the SGLANG_* variables a server saw ("sglang_env"); one started
    with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1 is not predicted, and `unmodelled_results` names it."""
    folder = as_compare(tmp_path / "Qwen3-8B")
    r = json.loads((folder / "tp2.json").read_text())
    (folder / "tp2.json").write_text(json.dumps(r | {"sglang_env": {"SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP": "1"}}))
    (folder / "dp2.json").write_text(json.dumps(json.loads((folder / "dp2.json").read_text())
                                                | {"sglang_env": {"SGLANG_IS_FLASHINFER_AVAILABLE": "false"}}))
    assert sorted(MOD["load"](folder)[2]) == ["dp2", "dp2_attn", "shift_sp2_tp1", "shift_sp2_tp1_th1"]
    assert MOD["unmodelled_results"](folder) == [
        "tp2: started with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1, which the planner does not model"]


def test_a_server_started_with_a_flag_the_planner_does_not_model_is_left_out_and_named(tmp_path):
    """`compare_report.unmodelled`: a shared server flag of `UNMODELLED_FLAGS` (`--enable-mixed-chunk`) or a modelled
    flag's value the planner cannot use (no chunking) leaves the server out; a chunk of 2,048 tokens is predicted with
    it (`compare_report.server_flags_of`), SGLang's default chunk written out (8,192) as the default."""
    from sgl_sidp.plan.planner import plan
    from sgl_sidp.plan.server_flags import DEFAULTS, ServerFlags

    folder = as_compare(tmp_path / "Qwen3-8B")
    for name, extra in (("tp2", " --chunked-prefill-size 2048 --tp-size 2"), ("dp2", " --enable-mixed-chunk"),
                        ("dp2_attn", " --chunked-prefill-size=8192"), ("shift_sp2_tp1_th1", " --chunked-prefill-size -1")):
        r = json.loads((folder / f"{name}.json").read_text())
        (folder / f"{name}.json").write_text(json.dumps(r | {"command": "python -m sglang.launch_server" + extra}))
    got = MOD["load"](folder)[2]
    assert sorted(got) == ["dp2_attn", "shift_sp2_tp1", "tp2"]
    assert got["tp2"]["server"] == ServerFlags(chunked_prefill_size=2048)
    assert got["dp2_attn"]["server"] == ServerFlags(chunked_prefill_size=8192) and got["shift_sp2_tp1"]["server"] == DEFAULTS
    assert MOD["unmodelled_results"](folder) == [
        "dp2: started with --enable-mixed-chunk, which the planner does not model",
        "shift_sp2_tp1_th1: started with --chunked-prefill-size -1: the planner simulates chunked prefill only (a chunk "
        "of at least 1 token), which the planner does not model"]
    # predicted with its chunk: SGLang's default memory fraction reserves less for it, so its pool holds more
    kv = {name: pred for name, what, _, pred, _ in MOD["rows"](got, str(QWEN3_8B), "H200", 2) if what.startswith("KV")}
    by_default = {r.name: r for r in plan(str(QWEN3_8B), 2, "H200", "latency:2048:4")["configurations"]}
    assert kv["tp2"] > by_default["tp2"].kv_tokens_total and kv["dp2_attn"] == by_default["dp2_attn"].kv_tokens_total


def test_a_burst_traced_from_its_start_is_measured_without_its_lone_first_forward():
    """`traced_span_ms`: `--profile-at-start` traces the burst's first prompt alone first (burst_profile_4gpu_h200:
    TP4's forwards of 78, 283, 276 and 273 ms); the prefill row is the mean of the forwards after it."""
    stage = {"span_ms": 227.9, "forwards": [{"span_ms": 77.7}, {"span_ms": 283.0}, {"span_ms": 276.0},
                                            {"span_ms": 273.0}]}
    assert MOD["traced_span_ms"](stage, skip_first=True) == pytest.approx(277.333, abs=1e-3)
    assert MOD["traced_span_ms"](stage) == 227.9 and MOD["traced_span_ms"]({"span_ms": 5.0}, True) == 5.0


def test_a_folder_whose_every_server_ran_with_such_a_switch_says_so_in_one_line(capsys):
    runs = ROOT / "benchmarks/results/multi_gpu/overlap_off_4gpu_h200/Qwen3-32B"
    with pytest.raises(SystemExit):
        validate.main([str(runs), "--model-path", str(ROOT.parent / "shared/models/Qwen3-32B"), "--gpu", "H200"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "nothing to predict: tp2_dp2: started with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1" in err


AZURE = ROOT.parent / "shared/traces/AzureLLMInferenceTrace_code.csv"


@pytest.mark.skipif(not (QWEN3_8B.is_dir() and AZURE.is_file()),
                    reason="needs ../shared/models/Qwen3-8B and ../shared/traces")
def test_a_what_if_reaches_the_replays_predictions():
    """`trace_rows` predicts each replay under the what-if it is given (`--prefill-factor` and the others reach the
    replays as they reach the bursts): a prefill at twice its price moves the replay's TTFT p50 up."""
    from sgl_sidp.plan.what_if import WhatIf

    key = "AzureLLMInferenceTrace_code@3x"
    args = "--trace=AzureLLMInferenceTrace_code.csv --time-scale=0.333333 --duration-s 20 --compress-gaps-s 5"
    measured = {"tp2": {"config": "tp2", "traces": {key: {"request_goodput": 1.0, "median_ttft_ms": 100.0,
                                                          "median_tpot_ms": 10.0}}}}
    rows = {what_if: {what: pred for _, what, _, pred, _ in validate.trace_rows(
        measured, {key: (args, (1000.0, 8.0))}, str(QWEN3_8B), "H200", 2, AZURE.parent, what_if)}
            for what_if in (validate.NO_WHAT_IF, WhatIf(prefill_factor=2.0))}
    calibrated, slow = rows.values()
    assert slow[f"{key}: TTFT p50"] > 1.3 * calibrated[f"{key}: TTFT p50"]


def test_a_stream_other_than_sglangs_default_is_named_as_unmodelled():
    """`compare_report.UNMODELLED_FLAGS`: the planner prices the scheduler's per-step output of every stream
    (`--stream-interval 1`, SGLang's default; q8_eager_si8_1gpu_h200 sent every 8th) in chunks of the whole output so
    far (q8_graphs512_incr_2gpu_h200 sent new tokens only)."""
    from sgl_sidp.bench.compare_report import unmodelled

    launch = "python -m sglang.launch_server --tp-size 1 --stream-interval "
    assert unmodelled({"command": launch + "1"}) is None
    assert unmodelled({"command": launch + "8"}) == (
        "started with --stream-interval 8, which the planner does not model")
    assert unmodelled({"command": launch + "1 --incremental-streaming-output --port 30000"}) == (
        "started with --incremental-streaming-output, which the planner does not model")


def test_a_replay_sent_without_objectives_is_validated_on_its_ttft_and_tpot(tmp_path):
    """A replay sent with no --slo-* flags has no goodput, but its TTFT and TPOT p50 still stand beside the planner's
    (`prefix_probe_1gpu_h200`: prefills over 8K-24K of cached prefix, one at a time, on one H200)."""
    from sgl_sidp.bench.traces import write_prefix_probes

    run = ROOT / "benchmarks/results/multi_gpu/prefix_probe_1gpu_h200/Qwen3-8B"
    write_prefix_probes(tmp_path / "prefix_probes.jsonl")
    measured = validate.load(run)[1]
    rows = validate.trace_rows(measured, validate.replay_settings(run), str(QWEN3_8B), "H200", 1, tmp_path)
    assert [(name, what) for name, what, *_ in rows] == [("tp1", "prefix_probes@1x: TTFT p50"),
                                                        ("tp1", "prefix_probes@1x: TPOT p50")]
    assert rows[0][3] == pytest.approx(rows[0][4], rel=0.05)


def test_stream_from_probes_predicts_at_the_runs_own_stream(capsys):
    """`--stream-from-probes`: the median of the servers' own stream probes (`compare --stream-probe`) as the
    what-if stream rate, said in a line first; a folder without probes, or with --stream-tokens-per-s too, is refused
    in one line."""
    run = ROOT / "benchmarks/results/multi_gpu/stream_check_1gpu_h200/Qwen3-8B-tp2-shard"
    assert validate.probed_stream_rate(run) == pytest.approx(15_940, abs=1)
    validate.main([str(run), "--model-path", str(run), "--gpu", "H200", "--stream-from-probes"])
    out = capsys.readouterr().out
    assert "own stream probes" in out and "15,940 tokens/s (median)" in out and "What-if:" in out
    without = ROOT / "benchmarks/results/multi_gpu/q8_stream_shard_1gpu_h200/Qwen3-8B-tp2-shard"
    for folder, more, err in ((without, [], "no server in"), (run, ["--stream-tokens-per-s", "9000"], "not --stream")):
        with pytest.raises(SystemExit):
            validate.main([str(folder), "--model-path", str(run), "--gpu", "H200", "--stream-from-probes", *more])
        assert err in capsys.readouterr().err.strip().splitlines()[-1]
