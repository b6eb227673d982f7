"""`python -m sgl_sidp.bench.compare` on CPU: the real orchestration (jobs, GPU sets, rounds in step, resuming, the
report) against stand-in servers (`tests/fake_sglang.py`, loopback only)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sgl_sidp.bench import compare, server_stats
from sgl_sidp.bench.batches import free_port
from sgl_sidp.bench.compare_report import best_vanilla, predictions, profile_table, render, replica_leaders

HERE = Path(__file__).resolve().parent
DENSE = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 4096,
         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
MOE = {**DENSE, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 256, "decoder_sparse_step": 1, "mlp_only_layers": []}
GEMMA = {**DENSE, "architectures": ["Gemma2ForCausalLM"]}


def model(tmp_path: Path, name: str, cfg: dict) -> Path:
    d = tmp_path / "models" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture
def fake(monkeypatch):
    """compare's launchers replaced by the stand-in server."""
    monkeypatch.setattr(compare, "LAUNCHERS", {k: "fake_sglang" for k in compare.LAUNCHERS})
    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{HERE.parent}")
    monkeypatch.setenv("FAKE_DIFFERS", "shift")
    calls = []
    real = compare.Measurement.start

    def counted(self):
        calls.append(self.job.name)
        return real(self)

    monkeypatch.setattr(compare.Measurement, "start", counted)
    return calls


def args(tmp_path, *extra):
    return ["--out-dir", str(tmp_path / "out"), "--load-format", "dummy", "--port", str(free_port()),
            "--ready-timeout-s", "60", "--no-predict", *extra]


def test_jobs_add_each_overlay_configurations_reference_and_skip_what_the_model_does_not_run(tmp_path):
    dense, moe = model(tmp_path, "dense", DENSE), model(tmp_path, "moe", MOE)
    jobs, notes = compare.plan_jobs([dense, moe], ["sidp_dp2_cas_graphs", "shift_sp2_tp1_th1", "zerodp_dp2_all",
                                                   "tp4", "tp1", "shift_sp1_tp2"], 2, True, tmp_path)
    assert [(j.model.name, j.name, j.gpus) for j in jobs] == [
        ("dense", "sidp_dp2_cas_graphs", 2), ("dense", "shift_sp2_tp1_th1", 2), ("dense", "tp1", 1),
        ("dense", "shift_sp1_tp2", 2), ("dense", "tp2", 2), ("moe", "zerodp_dp2_all", 2), ("moe", "tp1", 1)]
    assert any("dense zerodp_dp2_all: not a configuration of this model on 2 GPUs (dense model" in n for n in notes)
    assert any("moe sidp_dp2_cas_graphs: not a configuration" in n for n in notes)
    assert any("tp4: needs 4 GPUs, --gpus has 2" in n for n in notes)
    with pytest.raises(compare.CompareError, match="expected tpT"):
        compare.plan_jobs([dense], ["tp2", "pp2"], 2, False, tmp_path)


def test_bad_input_is_one_line_each_before_any_server(tmp_path, capsys, fake):
    dense = model(tmp_path, "dense", DENSE)
    rc = compare.main(["--model-path", str(dense), "--out-dir", str(tmp_path / "o"), "--configs", "tp2,xx",
                       "--burst", "8+16", "--trace", str(tmp_path / "missing.csv"), "--servers-per-gpu", "2",
                       "--alone", "0+1+1", "--profile-host", "calls"])
    err = capsys.readouterr().err.splitlines()
    assert "compare: error: --profile-host: give --profile too (the forwards to trace)" in err
    assert rc == 2 and not fake
    assert "compare: error: --burst 8+16: expected S+IN+OUT (three integers)" in err
    assert "compare: error: --alone 0+1+1: each of N, IN, OUT at least 1" in err
    assert any("missing.csv: no such file" in e for e in err)
    assert any("only for --exact alone" in e for e in err)
    assert any("no weights there; pass --load-format dummy" in e for e in err)
    rc = compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2,xx", "--exact"))
    assert rc == 2 and "configuration 'xx'" in capsys.readouterr().err


def test_exact_runs_references_packs_servers_and_resumes(tmp_path, fake):
    dense, gemma, moe = model(tmp_path, "dense", DENSE), model(tmp_path, "gemma", GEMMA), model(tmp_path, "moe", MOE)
    argv = args(tmp_path, "--model-path", str(dense), "--model-path", str(gemma), "--model-path", str(moe),
                "--configs", "sidp_dp2_was,shift_sp2_tp1,zerodp_dp2", "--gpus", "0,1", "--exact",
                "--servers-per-gpu", "3")
    assert compare.main(argv) == 0
    assert sorted(fake) == sorted(["tp1", "sidp_dp2_was", "tp2", "shift_sp2_tp1"] * 2 + ["tp1", "zerodp_dp2"])
    out = tmp_path / "out"
    sidp = json.loads((out / "dense" / "sidp_dp2_was.json").read_text())
    assert sidp["kv_tokens"] == {"0": 1000, "1": 1000} and sidp["gpu_count"] == 2 and sidp["startup_s"] > 0
    assert set(sidp["exact"]["ranks"]) == {"0", "1"} and sidp["exact"]["prompt_lens"] == [5, 64, 700, 2500, 4000]
    assert "--overlay-mode sidp --sidp-service was" in sidp["command"]
    assert json.loads((out / "gemma" / "sidp_dp2_was.json").read_text())["refused"].startswith(
        "sgl-sidp: error: --overlay-mode sidp supports")
    assert (out / "dense" / "logs" / "sidp_dp2_was.log.gz").exists() and (out / "dense" / "config.json").exists()
    md = (out / "compare.md").read_text()
    assert "| sidp_dp2_was |" in md and "bit-identical (10 answers) vs tp1" in md
    assert "differs: DP0, 2,500-token prompt, token 3 (logprob gap before it 0.002) vs tp2" in md
    assert "refused: sgl-sidp: error: --overlay-mode sidp supports" in md
    assert "bit-identical (10 answers) vs tp1" in md.split("## moe on 2")[1]  # ZeroDP's source and sink
    rows = json.loads((out / "summary.json").read_text())
    shift = next(r for r in rows if r["model"] == "dense" and r["configuration"] == "shift_sp2_tp1")
    assert shift["first_difference"] == {"rank": 0, "prompt_len": 2500, "token": 3, "logprob_gap": pytest.approx(0.002)}

    fake.clear()
    assert compare.main(argv) == 0 and fake == []  # every step done, the refusal kept: no server started
    (out / "dense" / "tp2.json").unlink()
    assert compare.main(argv) == 0 and fake == ["tp2"]


def test_timed_rounds_run_side_by_side_and_give_ratios_to_the_best_vanilla(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP", "1")  # recorded with the run (`validate.unmodelled`)
    dense = model(tmp_path, "dense", DENSE)
    trace = tmp_path / "az.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     + "".join(f"2023-11-16 18:15:4{i}.0000000,20,3\n" for i in range(3)))
    argv = args(tmp_path, "--model-path", str(dense), "--configs", "tp2,dp2,sidp_dp2_cas,tp4", "--gpus", "0,1,2,3",
                "--parallel", "--burst", "8+16+4", "--trace", str(trace), "--rates", "2,4", "--slo-ttft-ms", "5000",
                "--trace-args", "--compress-gaps-s 1")
    assert compare.main(argv) == 0
    assert compare.rounds(compare.plan_jobs([dense], ["tp2", "dp2", "sidp_dp2_cas", "tp4"], 4, False, tmp_path)[0],
                          4, True) and fake[:2] in (["tp2", "dp2"], ["dp2", "tp2"])
    out = tmp_path / "out"
    res = {n: json.loads((out / "dense" / f"{n}.json").read_text()) for n in ("tp2", "dp2", "sidp_dp2_cas", "tp4")}
    assert {n: r["gpus"] for n, r in res.items()} == {"tp2": "0,1", "dp2": "2,3", "sidp_dp2_cas": "0,1", "tp4": "0,1,2,3"}
    assert res["dp2"]["calibration_dir"].endswith("dense/calibration/dp2")  # servers at once: a cache each
    b = res["dp2"]["burst"]
    with gzip.open(tmp_path / "out" / "dense" / "bursts" / "dp2.jsonl.gz", "rt") as f:  # each request's times
        rows = [json.loads(line) for line in f]
    assert len(rows) == 8 and min(r["send_ms"] for r in rows) == 0.0 and all(r["success"] for r in rows)
    assert {r["dp_rank"] for r in rows} == {0, 1} and all(r["e2e_ms"] >= r["ttft_ms"] > 0 for r in rows)
    assert b["spec"] == "8+16+4" and b["failed"] == 0 and b["total_tok_s"] > 0
    assert sum(v["decode_tokens"] for v in b["per_rank"].values()) == 8 * 3
    t = res["sidp_dp2_cas"]["traces"]["az@2x"]
    assert t["completed"] == 3 and t["request_goodput"] > 0 and "az@4x" in res["sidp_dp2_cas"]["traces"]
    assert sum(v["decode_tokens"] for v in t["per_rank"].values()) == 3 * 2  # counted while the replay ran
    kept = out / "dense" / "traces" / "sidp_dp2_cas" / "az_2x"  # per-request file: the jsonl gzipped, no csv
    assert (kept / "requests.jsonl.gz").is_file() and not (kept / "requests.csv").exists()
    with gzip.open(kept / "requests.jsonl.gz", "rt") as f:  # each token's gap apart, in the git-ignored file
        assert [json.loads(line).get("itl_ms") for line in f] == [None] * 3
    with gzip.open(kept / compare.ITL_FILE, "rt") as f:
        gaps = [json.loads(line) for line in f]
    assert [r["id"] for r in gaps] == [0, 1, 2] and all(r["itl_ms"] for r in gaps)
    from sgl_sidp.bench.goodput import replays
    assert len(replays(out / "dense")["az@2x"]["sidp_dp2_cas"][0]) == 3
    from sgl_sidp.bench.validate import measured_requests
    assert [r["id"] for r in measured_requests(out / "dense", "sidp_dp2_cas", "az@2x")] == [0, 1, 2]
    md = (out / "compare.md").read_text()
    assert "## dense on 2 x unknown GPU" in md and "## dense on 4 x unknown GPU" in md
    assert "Trace replay az@2x:" in md and "Burst 8+16+4" in md
    rows = json.loads((out / "summary.json").read_text())
    sidp = next(r for r in rows if r["configuration"] == "sidp_dp2_cas" and r["metric"] == "total_tok_s")
    assert sidp["best_vanilla"] in ("tp2", "dp2") and sidp["ratio"] == pytest.approx(
        sidp["value"] / sidp["best_vanilla_value"])
    assert (out / "compare.png").stat().st_size > 0
    assert "SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1 python -m sgl_sidp.bench.compare" in (
        out / "commands.txt").read_text()
    assert all(r["sglang_env"]["SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP"] == "1" for r in res.values())


def test_deadline_leaves_jobs_for_the_next_call(tmp_path, fake):
    dense = model(tmp_path, "dense", DENSE)
    argv = args(tmp_path, "--model-path", str(dense), "--configs", "tp2,dp2", "--burst", "4+8+2", "--deadline-s", "0")
    assert compare.main(argv) == 1 and fake == []
    assert "## dense" not in (tmp_path / "out" / "compare.md").read_text()


def test_best_vanilla_is_taken_per_number_in_its_direction():
    group = {"tp2": {"technique": "vanilla", "x": 10.0}, "dp2": {"technique": "vanilla", "x": 20.0},
             "dp2_attn": {"technique": "dp_attention", "x": 5.0}, "sidp": {"technique": "sidp", "x": 40.0}}
    assert best_vanilla(group, lambda r: r["x"], True) == ("dp2", 20.0)
    assert best_vanilla(group, lambda r: r["x"], False) == ("dp2_attn", 5.0)


def vanilla_results(tmp_path, model: str, spec: str, runs) -> None:
    """A results folder tmp_path/<model> with the shared config of `model` (skips without ../shared/models) and one
    vanilla result on an H200 per (name, dp, tp, burst tok/s, KV tokens per rank) of `runs`."""
    src = Path(__file__).resolve().parents[2] / "shared" / "models" / model / "config.json"
    if not src.is_file():
        pytest.skip(f"{src} missing (../shared/models)")
    folder = tmp_path / model
    folder.mkdir()
    (folder / "config.json").write_text(src.read_text())
    for name, dp, tp, tok, kv in runs:
        (folder / f"{name}.json").write_text(json.dumps({
            "config": name, "base_name": name, "technique": "vanilla", "dp": dp, "tp": tp, "sp": 1,
            "gpu_count": dp * tp, "gpu_name": "NVIDIA H200", "kv_tokens": {str(r): kv for r in range(dp)},
            "burst": {"spec": spec, "total_tok_s": tok, "tpot_ms_p50": 20.0}}))


def test_the_report_puts_the_planners_prediction_beside_the_burst(tmp_path):
    vanilla_results(tmp_path, "Qwen3-8B", "64+512+64",
                    [("tp1", 1, 1, 10_000.0, 100_000), ("tp2", 1, 2, 30_000.0, 100_000), ("dp2", 2, 1, 40_000.0, 100_000)])
    md, rows, _ = render(tmp_path)
    two = md.split("## Qwen3-8B on 2 x NVIDIA H200")[1]
    assert "| dp2 | 40,000 (1.00x); pred. " in two and "| tp2 | 30,000 (0.75x); pred. " in two
    assert next(r for r in rows if r["configuration"] == "tp2")["predicted"] > 0


def test_the_planner_note_names_only_the_runs_configurations(tmp_path):
    """Llama-3.1-70B on 4 x H200: the planner cannot predict dp4 (no KV), which the run did not start; the report
    printed "Planner: the weights leave no KV cache" above a table whose every row it predicted."""
    vanilla_results(tmp_path, "Llama-3.1-70B", "128+2048+32", [("tp4", 1, 4, 13_983.0, 1_190_816)])
    md = render(tmp_path)[0]
    assert "| tp4 | 13,983 (1.00x); pred. " in md and "Planner:" not in md
    rows, note = predictions(tmp_path, "Llama-3.1-70B", "NVIDIA H200", 4, "128+2048+32", ["tp4", "dp4"])
    assert note == "dp4: the weights leave no KV cache"


def test_a_configuration_the_planner_does_not_predict_shows_no_prediction(tmp_path):
    """sidp_dp2_auto_measured (B_th measured at start-up) on 2 x H100: the report showed "pred. 0 (-100%)" for its KV."""
    vanilla_results(tmp_path, "Qwen3-32B", "128+4096+16", [("tp2", 1, 2, 14_784.0, 275_619)])
    r = json.loads((tmp_path / "Qwen3-32B" / "tp2.json").read_text())
    r.update(config="sidp_dp2_auto_measured", base_name="sidp_dp2_auto", technique="sidp", dp=2, tp=1,
             kv_tokens={"0": 105_606, "1": 105_606}, burst={**r["burst"], "total_tok_s": 14_450.0})
    (tmp_path / "Qwen3-32B" / "sidp_dp2_auto_measured.json").write_text(json.dumps(r))
    md = render(tmp_path)[0]
    row = next(ln for ln in md.splitlines() if ln.startswith("| sidp_dp2_auto_measured | ") and "KV" not in ln
               and "105,606, 105,606" in ln)
    assert "pred." not in row and "| tp2 | " in md and "option 'measured'" in md


def test_jit_kernels_of_every_model_and_kv_layout_are_built_ahead(tmp_path, monkeypatch):
    from sgl_sidp.plan import jit_prebuild

    dense, moe = model(tmp_path, "dense", DENSE), model(tmp_path, "moe", MOE)
    jobs, _ = compare.plan_jobs([dense, moe], ["tp1", "shift_sp2_tp1", "zerodp_dp2"], 2, False, tmp_path)
    seen = {}
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_capability", lambda i: (9, 0))
    monkeypatch.setattr(jit_prebuild, "start", lambda mods, cap, log_dir: seen.update(mods=mods, cap=cap) or "started")
    assert compare.start_jit_prebuild(jobs, ["0", "1"], tmp_path) == "started" and seen["cap"] == (9, 0)
    rows = sorted(m.args[0] for m in seen["mods"] if m.builder == jit_prebuild.BUILDERS["kvcache"])
    assert rows == [256, 512]  # 4 KV heads x 64 x 2 bytes at TP1, 2 heads at Shift's TP = 2 layout
    assert [m.args for m in seen["mods"] if m.builder == jit_prebuild.BUILDERS["all_reduce"]] == [("torch.bfloat16", 2)]
    assert len(seen["mods"]) == len(set(seen["mods"]))  # the two models' common modules once
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_capability", lambda i: None)
    assert compare.start_jit_prebuild(jobs, ["0"], tmp_path) is None


def test_sigterm_stops_the_servers_and_keeps_what_was_measured(tmp_path):
    """`timeout` ends a device call's compare: its servers run in their own sessions and must stop with it, also
    when a second SIGTERM follows the first while the servers are being stopped."""
    import os
    import signal
    import subprocess
    import sys
    import time

    dense = model(tmp_path, "dense", DENSE)
    code = ("import sys; from sgl_sidp.bench import compare; "
            "compare.LAUNCHERS = {k: 'fake_sglang' for k in compare.LAUNCHERS}; sys.exit(compare.main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": f"{HERE}:{HERE.parent}"}
    proc = subprocess.Popen([sys.executable, "-c", code, *args(tmp_path, "--model-path", str(dense), "--configs", "tp2",
                                                              "--burst", "4000+16+400")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    res = tmp_path / "out" / "dense" / "tp2.json"
    deadline = time.time() + 60
    while time.time() < deadline and "kv_tokens" not in (res.read_text() if res.exists() else ""):
        time.sleep(0.2)
    time.sleep(1.0)  # inside the burst
    pid = json.loads(res.read_text())
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "interrupted: the servers stopped" in out and "Traceback" not in out
    assert pid["kv_tokens"] == {"0": 2000}
    left = subprocess.run(["pgrep", "-f", "fake_sglang"], capture_output=True, text=True).stdout.split()
    assert not left, f"fake servers still running: {left}"


def test_sigterm_while_a_server_comes_up_stops_it_without_a_traceback(tmp_path, monkeypatch):
    """q32_shift_1.5x_4gpu_h100: `timeout` stopped compare (its SIGTERM handler stops every live server) while a
    third server came up, and the starting thread then met its server gone (an AttributeError traceback)."""
    import threading

    from sgl_sidp.bench import server

    dense = model(tmp_path, "dense", DENSE)
    a = compare.parse_args(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "8+16+4"))
    a.live, a.stopping = set(), threading.Event()
    jobs, _ = compare.plan_jobs([dense], ["tp2"], 2, False, tmp_path / "out")
    m = compare.Measurement(jobs[0], a, ["0", "1"], 30000)

    class Stopped:  # the handler stops the server while wait_ready waits: wait_ready then raises
        def __init__(self, *args, **kw):
            self.command = ["fake"]

        def start(self):
            pass

        def wait_ready(self, timeout_s):
            a.stopping.set()
            for live in list(a.live):
                live.stop()
            raise RuntimeError("the server exited")

        def stop(self):
            pass

    monkeypatch.setattr(server, "ServerProcess", Stopped)
    monkeypatch.setattr(compare, "busy_gpus", lambda gpus: [])
    assert m.start() is False and m.srv is None and not a.live


def test_report_needs_the_results_folder_alone(tmp_path, capsys):
    assert compare.main(["--report", "--out-dir", str(tmp_path / "none")]) == 2
    assert "--out-dir" in capsys.readouterr().err
    (tmp_path / "res").mkdir()
    assert compare.main(["--report", "--out-dir", str(tmp_path / "res")]) == 0
    assert (tmp_path / "res" / "compare.md").exists()


def test_config_args_reach_one_configuration_only(tmp_path, capsys):
    """--config-args NAME=ARGS adds flags after --extra-args to that configuration's server alone; a name not in
    --configs is one line of error."""
    dense = model(tmp_path, "dense", DENSE)
    a = compare.parse_args(args(tmp_path, "--model-path", str(dense), "--configs", "dp2,zerodp_dp2", "--burst", "8+16+4",
                                "--extra-args", "--attention-backend triton",
                                "--config-args", "dp2=--max-running-requests 64 --chunked-prefill-size 4096"))
    jobs, _ = compare.plan_jobs([dense], ["dp2", "tp2"], 2, False, tmp_path)
    flags = {j.name: compare.server_flags(j, a)[1] for j in jobs}
    assert flags["dp2"][-8:] == ["--attention-backend", "triton", "--max-running-requests", "64",
                                 "--chunked-prefill-size", "4096", "--dp-size", "2"]
    assert "--max-running-requests" not in flags["tp2"]
    res = {"config": "dp2", "model": "dense", "gpu_name": "g", "gpu_count": 2, "technique": "vanilla", "dp": 2, "tp": 1,
           "config_args": "--chunked-prefill-size 4096", "started": "t",
           "burst": {"spec": "8+16+4", "total_tok_s": 10.0, "per_rank": {}}}
    (tmp_path / "rep" / "dense").mkdir(parents=True)
    (tmp_path / "rep" / "dense" / "dp2.json").write_text(json.dumps(res))
    rows = render(tmp_path / "rep", predict=False)[1]
    assert rows and all(r["flags"] == "--chunked-prefill-size 4096" for r in rows)  # the summary names the flags
    rc = compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "dp2", "--burst", "8+16+4",
                           "--config-args", "tp4=--x 1"))
    assert rc == 2 and "compare: error: --config-args tp4=...: tp4 is not one of --configs" in capsys.readouterr().err


def test_our_launcher_ranks_configurations_on_the_burst_sent(tmp_path):
    """A technique's start-up line and auto's pick rank the configurations on the burst this run sends (Llama-3.1-70B
    SiDP on 4 x H200 logged its prediction for the default offline:512:2048:256 while it ran 128 x (4,096, 16));
    vanilla SGLang gets no such flag, and a workload named in the flags is kept."""
    dense = model(tmp_path, "dense", DENSE)
    jobs, _ = compare.plan_jobs([dense], ["tp2", "sidp_dp2_was", "auto"], 2, False, tmp_path)
    a = compare.parse_args(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "128+4096+16"))
    flags = {j.name: compare.server_flags(j, a) for j in jobs}
    assert flags["tp2"][0] == "sglang.launch_server" and "--overlay-plan-workload" not in flags["tp2"][1]
    for name in ("sidp_dp2_was", "auto"):
        assert flags[name][1][-2:] == ["--overlay-plan-workload", "offline:128:4096:16"]
    a = compare.parse_args(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "128+4096+16",
                                "--extra-args", "--overlay-plan-workload latency:512:64"))
    named = compare.server_flags(next(j for j in jobs if j.name == "sidp_dp2_was"), a)[1]
    assert named.count("--overlay-plan-workload") == 1 and "latency:512:64" in named
    a = compare.parse_args(args(tmp_path, "--model-path", str(dense), "--configs", "tp2"))
    assert compare.server_flags(next(j for j in jobs if j.name == "auto"), a)[1][-1] == "offline:512:2048:256"


def test_servers_one_after_the_other_share_a_calibration_cache(tmp_path, fake):
    """Sequential servers of a model read and write one cache (a ZeroDP source calibrates once, a sink's copy rates
    reach the next ZeroDP configuration); servers that run at once each have their own (the parallel test above)."""
    dense = model(tmp_path, "dense", DENSE)
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2,dp2", "--burst", "4+8+2",
                             "--alone", "2+8+3")) == 0
    res = {n: json.loads((tmp_path / "out" / "dense" / f"{n}.json").read_text()) for n in ("tp2", "dp2")}
    assert res["tp2"]["calibration_dir"] == res["dp2"]["calibration_dir"] == str(
        tmp_path / "out" / "dense" / "calibration" / "shared")
    alone = res["dp2"]["alone"]  # --alone: requests one after the other
    assert alone["spec"] == "2+8+3" and alone["failed"] == 0 and alone["ttft_ms_p50"] > 0 and alone["tpot_ms_p50"] > 0
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "Alone 2+8+3 (N+IN+OUT, each request after the last finished):" in md


def test_profile_step_summarises_every_gpus_traces_by_kernel_class(tmp_path, fake):
    dense = model(tmp_path, "dense", DENSE)
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2,dp2", "--gpus", "0,1",
                             "--profile", "4+16+5", "--profile-steps", "2")) == 0
    out = tmp_path / "out"
    for name, ranks in (("tp2", {"TP-0", "TP-1"}), ("dp2", {"TP-0-DP-0", "TP-0-DP-1"})):
        prof = json.loads((out / "dense" / f"{name}.json").read_text())["profile"]
        assert prof["spec"] == "4+16+5" and prof["steps"] == 2 and prof["chunked_prefill_size"] == 8192
        assert set(prof["ranks"]) == ranks and prof["traces"] == 4
        pre = prof["ranks"][sorted(ranks)[0]]["prefill"]
        assert pre["by_class_ms"] == {"gemm": 6.0, "comm": 2.0} and pre["span_ms"] == pytest.approx(8.0) and pre["busy_ms"] == pytest.approx(6.0)
        assert not list((out / "dense" / "profile" / name).glob("*.gz"))  # summarised, then removed
    md = (out / "compare.md").read_text()
    assert "Profile 4+16+5" in md and "| tp2 | TP-0 | prefill |" in md and "| dp2 | TP-0-DP-0 | decode |" in md


def test_profile_spec_is_checked_before_any_server(tmp_path, capsys):
    dense = model(tmp_path, "dense", DENSE)
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--profile", "4+16+3")) == 2
    assert "OUT must be at least --profile-steps + 2" in capsys.readouterr().err
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--profile", "4+x+9")) == 2
    assert "--profile 4+x+9: expected S+IN+OUT" in capsys.readouterr().err


def test_the_profile_table_shows_every_dp_replica():
    """SiDP on 2 x H100: DP0's CaS decodes waited 51 ms in all-gathers, DP1's 233 ms; the table showed DP0 alone."""
    stage = lambda ms: {"span_ms": ms, "busy_ms": ms, "by_class_ms": {"comm": ms / 2}, "top": [["nccl", ms / 2, 1]]}  # noqa: E731
    prof = {"spec": "16+4096+8", "steps": 2, "chunked_prefill_size": 8192,
            "ranks": {"TP-0-DP-1": {"decode": stage(288.0)}, "TP-0-DP-0": {"decode": stage(81.3)}}}
    tp = {**prof, "ranks": {"TP-1": {"decode": stage(18.0)}, "TP-0": {"decode": stage(18.4)}}}
    lines = profile_table({"sidp_dp2_auto": {"profile": prof}, "tp2": {"profile": tp}})
    rows = [ln.split(" | ")[:3] for ln in lines if ln.startswith("| sidp") or ln.startswith("| tp2")]
    assert rows == [["| sidp_dp2_auto", "TP-0-DP-0", "decode"], ["| sidp_dp2_auto", "TP-0-DP-1", "decode"],
                    ["| tp2", "TP-0", "decode"]]
    assert replica_leaders(["TP-1-DP-0", "TP-0-DP-1", "TP-0-DP-0", "TP-1-DP-1"]) == ["TP-0-DP-0", "TP-0-DP-1"]
    assert replica_leaders(["rank3"]) == ["rank3"]


def test_a_run_without_the_planners_first_vanilla_configuration_says_so_before_any_server(tmp_path, monkeypatch):
    """Qwen3-32B on 2 x H100, prefill-only: the planner ranks DP2 first among vanilla configurations (a 1-output
    request frees its KV at once); a run of TP2 and SiDP says its ratios are against TP2 only, and one with DP2 says
    nothing."""
    q32 = HERE.parent.parent / "shared" / "models" / "Qwen3-32B"
    if not (q32 / "config.json").is_file():
        pytest.skip(f"{q32} missing (../shared/models)")
    monkeypatch.setattr(compare, "gpu_name", lambda index: "NVIDIA H100 80GB HBM3")
    a = compare.parse_args(["--model-path", str(q32), "--gpus", "0,1", "--configs", "tp2,sidp_dp2_was",
                            "--burst", "128+4096+1", "--out-dir", str(tmp_path)])
    jobs, _ = compare.plan_jobs([q32], ["tp2", "sidp_dp2_was"], 2, False, tmp_path)
    (line,) = compare.vanilla_gaps(jobs, a)
    assert line.startswith("Qwen3-32B on 2 GPUs: the planner ranks dp2 (pred. 1.1") and "x tp2) first" in line
    jobs, _ = compare.plan_jobs([q32], ["tp2", "dp2", "sidp_dp2_was"], 2, False, tmp_path)
    assert compare.vanilla_gaps(jobs, a) == []
    monkeypatch.setattr(compare, "gpu_name", lambda index: None)  # no NVML: nothing to say
    assert compare.vanilla_gaps(jobs[:1], a) == []


def test_a_declining_mode_is_recorded_as_the_vanilla_configuration_it_started():
    """ZeroDP predicted to offload nothing starts vanilla SGLang (`Feature.declines`); compare reads which from the
    launcher's line, so the row reads "zerodp_dp2 -> dp2 (declined)" rather than as a ZeroDP measurement."""
    log = ("[x] sgl-sidp: --overlay-mode zerodp declines: on 2 x NVIDIA H100 80GB HBM3 its policy is predicted to "
           "offload no MoE layer at --zerodp-expected-batch decode:1 (...), so every sink would be a vanilla DP replica "
           "with less KV; starting vanilla SGLang (dp2: --dp-size 2 --tp-size 1, SGLang's own routing) instead\n"
           "[y] sgl-sidp: overlay mode=off (batch signal off)\n")
    assert server_stats.declined_to(log) == "dp2"
    assert server_stats.declined_to("[y] sgl-sidp: overlay mode=zerodp (batch signal on)\n") is None


def test_warm_up_rehearses_the_bursts_shapes_outside_every_number(monkeypatch):
    """Before a burst, one request per DP rank of its prompt length and enough more to fill a chunk (at most 4 output
    tokens, prompts of their own) go through the router, then one per rank a token shorter, so Triton's first
    compiles of its chunk shapes and the first full-chunk forward's one-time cost fall outside the measured burst."""
    from types import SimpleNamespace

    from sgl_sidp.bench import batches

    sent, chunk = [], {"chunked_prefill_size": 8192}

    def http_json(url, body=None, timeout_s=None):
        if url.endswith("/server_info"):
            if chunk is None:
                raise OSError("no answer")
            return chunk
        sent.append(("one", len(body["input_ids"])))

    monkeypatch.setattr(compare, "http_json", http_json)
    monkeypatch.setattr(batches, "run_batch", lambda url, bodies: sent.append(
        ("router", [(len(ids), o, rank) for ids, o, rank in bodies])))
    runner = object.__new__(compare.Measurement)
    runner.srv, runner.ranks = SimpleNamespace(base_url="http://x"), 2
    runner.a = SimpleNamespace(burst="64+8192+32", profile=None)
    runner.warm_up()
    # then one a rank a token shorter (a size that does not divide by 16: Triton compiles that class apart)
    assert sent[-2:] == [("router", [(8192, 4, None)] * 4), ("router", [(8191, 4, None)] * 2)] and len(sent) == 6
    assert batches.prompts(4, 8192, 3)[0] != batches.prompts(64, 8192, 7)[0]  # not the burst's: no radix-cache hits
    # every step its own seed: one seed's prompts share their first row, shorter or longer (a cache hit)
    assert len(set(compare.PROMPT_SEEDS.values())) == len(compare.PROMPT_SEEDS)
    assert batches.prompts(2, 8191, 5)[0] == batches.prompts(64, 8192, 5)[0][:8191]
    for chunk, n in (({"chunked_prefill_size": 8192}, 10), ({"chunked_prefill_size": 4096}, 6), (None, 10)):
        sent[:] = []
        runner.a = SimpleNamespace(burst="64+2048+32", profile=None)
        runner.warm_up()  # a full chunk of 2,048-token prompts a rank; SGLang's 8,192 where the server does not say
        assert sent[-2] == ("router", [(2048, 4, None)] * n)
    runner.a, sent[:] = SimpleNamespace(burst=None, profile=None), []
    runner.warm_up()
    assert [k for k, _ in sent] == ["one"] * 4
    assert [compare.rehearsal_size(i, 8192) for i in (2048, 3000, 8192, 16384)] == [5, 4, 2, 2]


def test_busy_gpus_name_each_gpu_another_process_holds_and_wait_for_one_being_freed():
    held = {0: (int(0.6 * 2**30), [11]), 1: (int(131.4 * 2**30), [27039, 27040])}
    assert compare.busy_gpus(["0", "1"], wait_s=0, used=held.get) == [
        "GPU 1 already holds 131.4 GiB (pids 27039, 27040): another process runs there"]
    assert compare.busy_gpus(["0"], wait_s=0, used=held.get) == []
    assert compare.busy_gpus(["0", "1"], wait_s=0, used=lambda i: None) == []  # NVML cannot tell: no check
    freeing = iter([(80 * 2**30, [5]), (2**29, [])])  # the last configuration's server exiting
    assert compare.busy_gpus(["2"], wait_s=5, used=lambda i: next(freeing)) == []


def test_a_busy_gpu_leaves_its_configuration_with_one_line_and_starts_no_server(tmp_path, fake, monkeypatch):
    dense = model(tmp_path, "dense", DENSE)
    monkeypatch.setattr(compare, "busy_gpus", lambda gpus: [f"GPU {gpus[-1]} already holds 131.4 GiB (pids 7): "
                                                            "another process runs there"])
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "4+16+4")) == 1
    res = json.loads((tmp_path / "out" / "dense" / "tp2.json").read_text())
    assert res["error"] == {"where": "start", "what": "GPU 1 already holds 131.4 GiB (pids 7): another process runs there"}
    assert "command" in res and not (tmp_path / "out" / "dense" / "logs" / "tp2.log").exists()
    assert "did not start: GPU 1 already holds 131.4 GiB" in (tmp_path / "out" / "compare.md").read_text()


def test_the_threshold_a_shift_server_ran_at_is_read_from_its_log():
    line = ("[2026-11-27 16:04:16 TP0] sgl-sidp shift TP0: ready; P=4, base SP=2 TP=2 above {} tokens per forward "
            "(start-up calibration (3.1 s, dummy prefill bodies, before the prefill graphs))")
    assert server_stats.shift_threshold_logged("x\n" + line.format(2048) + "\n") == 2048.0
    assert server_stats.shift_threshold_logged(line.format("inf")) == float("inf")
    assert server_stats.shift_threshold_logged(line.format(512).replace("TP0", "TP1")) is None  # TP0's alone
    assert server_stats.shift_threshold_logged("The server is fired up") is None
    assert server_stats.shift_threshold_logged(line.format(512) + "; exchanges by overlap") == 512.0
    assert server_stats.shift_exchange_logged(line.format(512) + "; exchanges by overlap") == "overlap"
    assert server_stats.shift_exchange_logged(line.format(512) + "; exchanges by nccl") == "nccl"
    assert server_stats.shift_exchange_logged(line.format(512)) is None  # a server before the field: NCCL


def test_burst_twice_runs_the_shapes_once_before_and_keeps_both(tmp_path, fake, capsys):
    """`--burst-twice`: the burst's shapes once before the measured burst, on prompts of their own, its numbers and
    requests kept apart ("burst_first", `bursts/<name>.first.jsonl.gz`); without `--burst` it is refused first."""
    dense = model(tmp_path, "dense", DENSE)
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst-twice",
                             "--exact")) == 2
    assert "--burst-twice: give --burst too" in capsys.readouterr().err and fake == []
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "4+16+3",
                             "--burst-twice")) == 0
    res = json.loads((tmp_path / "out" / "dense" / "tp2.json").read_text())
    assert res["burst_first"]["failed"] == 0 and res["burst_first"]["total_tok_s"] > 0
    assert res["burst_first"]["gap_s"] == 0.0
    assert res["burst"]["spec"] == "4+16+3" and res["burst"]["failed"] == 0
    for name in ("tp2.first.jsonl.gz", "tp2.jsonl.gz"):
        with gzip.open(tmp_path / "out" / "dense" / "bursts" / name, "rt") as f:
            assert len([json.loads(line) for line in f]) == 4


def test_freeze_gc_freezes_each_server_after_its_warm_up(tmp_path, fake):
    """`--freeze-gc`: SGLang's /freeze_gc (a plain-text answer) once the server is warmed up, recorded as "freeze_gc"."""
    dense = model(tmp_path, "dense", DENSE)
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "4+16+3",
                             "--freeze-gc")) == 0
    res = json.loads((tmp_path / "out" / "dense" / "tp2.json").read_text())
    assert res["freeze_gc"] is True and res["burst"]["failed"] == 0


def test_burst_gap_idles_the_server_between_the_two_bursts(tmp_path, fake, capsys, monkeypatch):
    """`--burst-gap-s S`: the server idles S seconds between `--burst-twice`'s bursts (recorded as "gap_s"); without
    `--burst-twice`, or below 0, it is refused before any server starts."""
    dense = model(tmp_path, "dense", DENSE)
    for extra, err in ((["--burst-gap-s", "5"], "--burst-gap-s 5: give --burst-twice too"),
                       (["--burst-twice", "--burst-gap-s", "-1"], "--burst-gap-s -1: must be at least 0")):
        assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "4+16+3",
                                 *extra)) == 2
        assert err in capsys.readouterr().err and fake == []
    slept = []
    monkeypatch.setattr(compare.time, "sleep", lambda s: slept.append(s))
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "4+16+3",
                             "--burst-twice", "--burst-gap-s", "7.5")) == 0
    assert 7.5 in slept
    assert json.loads((tmp_path / "out" / "dense" / "tp2.json").read_text())["burst_first"]["gap_s"] == 7.5


def test_the_prefill_forwards_one_by_one_are_aligned_across_gpus():
    """--profile-at-start on TP2: rank 1's trace starts 50 ms after rank 0's, so its forwards are shown 50 ms later."""
    fw = lambda *f: [{"start_ms": s, "span_ms": sp, "busy_ms": b, "comm_ms": c} for s, sp, b, c in f]  # noqa: E731
    stage = lambda first_us, forwards: {"span_ms": 1.0, "busy_ms": 1.0, "by_class_ms": {}, "top": [],  # noqa: E731
                                        "first_us": first_us, "forwards": forwards}
    prof = {"spec": "64+2048+32", "steps": 3, "chunked_prefill_size": 8192, "at_start": True,
            "ranks": {"TP-0": {"prefill": stage(1e6, fw((0, 270, 80, 190), (300, 280, 275, 20)))},
                      "TP-1": {"prefill": stage(1e6 + 5e4, fw((0, 220, 80, 140), (250, 280, 275, 20)))}}}
    lines = profile_table({"tp2": {"profile": prof}})
    assert "| tp2 | TP-0 | 0+270 (80, 190) | 300+280 (275, 20) |" in lines
    assert "| tp2 | TP-1 | 50+220 (80, 140) | 300+280 (275, 20) |" in lines
    assert "| configuration | GPU | forward 1 | forward 2 |" in lines
    prof["ranks"]["TP-0"]["prefill"]["host_waits"] = [[59.0, 210.5, "cudaStreamSynchronize"]]
    assert "| tp2 | TP-0 | 59+210 cudaStreamSynchronize |" in profile_table({"tp2": {"profile": prof}})
    # a profile summarised without its forwards counted (older results) has no such table
    del prof["ranks"]["TP-0"]["prefill"]["forwards"], prof["ranks"]["TP-1"]["prefill"]["forwards"]
    assert not any("forward 1" in ln for ln in profile_table({"tp2": {"profile": prof}}))


def test_the_host_timeline_is_shown_per_stage_where_the_host_was_traced():
    """--profile-host: each forward's launches / GPU span / lag / gap, then the host's heaviest functions."""
    tl = {"forwards": [{"launch_ms": 30.0, "gpu_ms": 31.1, "lag_ms": 1.1, "gap_ms": 16.4},
                       {"launch_ms": 29.5, "gpu_ms": 30.0, "lag_ms": 0.5, "gap_ms": None}],
          "in_gaps": [["scheduler.py(9): process_batch_result", 9.0]], "in_launches": [["cudaLaunchKernel", 8.0]]}
    prof = {"spec": "384+1024+16", "steps": 2, "chunked_prefill_size": 8192,
            "ranks": {"TP-0": {"decode": {"span_ms": 1.0, "busy_ms": 1.0, "by_class_ms": {}, "top": [], "host": tl}}}}
    lines = profile_table({"tp1": {"profile": prof}})
    assert "| tp1 | TP-0 | decode | 30 / 31.1 / 1.1 / 16.4; 29.5 / 30 / 0.5 / - |" in lines
    assert "| tp1 | TP-0 | decode | gaps | scheduler.py(9): process_batch_result 9 |" in lines
    assert "| tp1 | TP-0 | decode | launches | cudaLaunchKernel 8 |" in lines
    del prof["ranks"]["TP-0"]["decode"]["host"]
    assert not any("Host timeline" in ln for ln in profile_table({"tp1": {"profile": prof}}))


def test_a_server_started_with_a_switch_the_planner_does_not_model_gets_no_prediction(tmp_path):
    """`compare_report.render`: overlap_off_4gpu_h200's servers ran with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1
    (their "sglang_env"); overlap_on's did not, so it is predicted beside its measurement."""
    from sgl_sidp.bench.compare_report import render

    runs = Path(__file__).resolve().parents[1] / "benchmarks/results/multi_gpu"
    off, _, _ = render(runs / "overlap_off_4gpu_h200")
    on, _, _ = render(runs / "overlap_on_4gpu_h200")
    assert "); pred." not in off and "Planner: tp4: started with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1" in off
    assert "| tp4 | 27,227 (1.00x); pred." in on


def test_a_result_left_out_for_a_flag_alone_renders_and_its_rows_say_so():
    """`compare_report.render` of a run whose server the planner leaves out for a shared flag, not a switch
    (q32_prefill_mixed_2gpu_h100: `--enable-mixed-chunk`, recorded before results had "sglang_env"): the report
    renders, and that configuration's summary rows are marked (an empty "sglang_env")."""
    from sgl_sidp.bench.compare_report import render

    runs = Path(__file__).resolve().parents[1] / "benchmarks/results/multi_gpu"
    md, rows, _ = render(runs / "q32_prefill_mixed_2gpu_h100", predict=False)
    marked = {r["configuration"] for r in rows if "sglang_env" in r}
    assert marked == {"sidp_dp2_auto_measured"} and all(r["sglang_env"] == {} for r in rows if "sglang_env" in r)


def test_stream_probe_measures_each_servers_stream_after_its_warm_up(tmp_path, fake, monkeypatch):
    """`--stream-probe`: `plan calibrate`'s stream probe once the server is warmed up, kept as "stream_probe" (the
    delivered rate, or why nothing was counted) and reported in a line beside the planner's stream rate."""
    from sgl_sidp.plan import calibrate

    monkeypatch.setattr(calibrate, "STREAM_PROBE", (8, 4, 40))
    dense = model(tmp_path, "dense", DENSE)
    assert compare.main(args(tmp_path, "--model-path", str(dense), "--configs", "tp2", "--burst", "4+16+3",
                             "--stream-probe")) == 0
    res = json.loads((tmp_path / "out" / "dense" / "tp2.json").read_text())
    probe = res["stream_probe"]
    assert probe["probe"][:2] == [8, 4] and probe["delivered_tokens_per_s"] > 0, probe
    report = (tmp_path / "out" / "compare.md").read_text()
    assert "Stream probe (8 x (4 in, 40 out) after the warm-up" in report and "tp2 " in report
