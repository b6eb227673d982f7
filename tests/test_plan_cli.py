"""`python -m sgl_sidp.plan`: the JSON keys scripts rely on, the table, the PNG, and one line with exit code 2 for
bad input."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sgl_sidp.plan.__main__ import main
from sgl_sidp.plan.planner import plan

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
KEYS = {"name", "technique", "dp", "tp", "sp", "weights_gb_per_gpu", "kv_tokens_total", "decode_step_ms", "prefill_ms",
        "total_tok_s", "output_tok_s", "ttft_ms_p50", "tpot_ms_p50", "ttft_ms_p99", "tpot_ms_p99"}


@pytest.fixture
def qwen3_8b():
    path = MODELS / "Qwen3-8B"
    if not (path / "config.json").is_file():
        pytest.skip(f"{path} missing (../shared/models)")
    return str(path)


def test_json_keeps_the_keys_scripts_rely_on(qwen3_8b):
    r = plan(qwen3_8b, 2, "H200", "offline:32:1024:64")
    by = {c.name: c.as_dict() for c in r["configurations"]}  # as --json prints them
    predicted = {n for n, c in by.items() if "total_tok_s" in c}
    # bundled H200 shards: every configuration of 2 GPUs
    assert r["predicted"] is True and predicted == set(by) and r["winner"] in predicted
    assert {c["technique"] for c in by.values()} == {"vanilla", "dp_attention", "sidp", "shift"}
    assert r["launch"][:3] == ["python", "-m", "sgl_sidp.launch_server"] and r["objective"] == "throughput"
    for name in predicted:
        assert KEYS <= set(by[name]) and set(by[name]["decode_step_ms"]) >= {"256", "2048"}
    assert all("not_predicted" in c for n, c in by.items() if n not in predicted)
    assert all({"name", "technique", "dp", "tp", "sp", "weights_gb_per_gpu", "kv_tokens_total"} <= set(c) for c in by.values())


def test_a_configuration_stepping_as_another_is_simulated_once(qwen3_8b, monkeypatch):
    """On 8 GPUs at 2,048-token prompts SiDP DP2 x TP4's auto has B_th 1 (WaS wins from batch 1): it steps as WaS but
    in lockstep (one all-gather of token counts per iteration), so its schedule is its own; `_bth1`, the same B_th
    named, steps as it does: simulated once for both."""
    import sgl_sidp.plan.planner as planner

    calls = []
    simulate = planner.simulate
    monkeypatch.setattr(planner, "simulate",  # the burst as sent (a lockstep one is also simulated in phase)
                        lambda reqs, reps, route=None, **kw: calls.append(max(r.arrival_s for r in reqs) > 0)
                        or simulate(reqs, reps, route, **kw))
    by = {c.name: c for c in plan(qwen3_8b, 8, "H200", "offline:16:2048:256",
                                  names=["sidp_dp2_tp4_auto_bth1"])["configurations"]}
    assert by["sidp_dp2_tp4_auto"].decisions["b_th"] == 1.0 and by["sidp_dp4_tp2_auto"].decisions["b_th"] > 1
    summary = ("total_tok_s", "ttft_ms_p50", "tpot_ms_p99", "makespan_s")
    assert [getattr(by["sidp_dp2_tp4_auto"], k) for k in summary] == [
        getattr(by["sidp_dp2_tp4_auto_bth1"], k) for k in summary]
    assert sum(calls) == sum(c.predicted for c in by.values()) - 1


def test_table_and_png_label_every_number_predicted(qwen3_8b, tmp_path, capsys):
    main(["--model-path", qwen3_8b, "--gpus", "2", "--workload", "latency:512:16", "--png", str(tmp_path / "p.png")])
    out = capsys.readouterr().out
    assert out.startswith("Predicted for ") and "(every number below is a prediction)" in out and "Winner (predicted)" in out
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_more_gpus_than_any_measured_node_is_called_an_extrapolation(qwen3_8b, capsys):
    """8 GPUs (more than any node the predictions were measured on, `MEASURED_GPU_COUNTS`): one line under the
    table's title and an "extrapolation" field in --json; 1, 2 and 4 GPUs: neither."""
    from sgl_sidp.plan.planner import MEASURED_GPU_COUNTS, extrapolation

    line = "8 GPUs: an extrapolation (no 8-GPU node has measured these predictions; nodes of 1, 2 and 4 GPUs have)"
    assert MEASURED_GPU_COUNTS == (1, 2, 4) and extrapolation(8) == line and extrapolation(3).startswith("3 GPUs: ")
    main(["--model-path", qwen3_8b, "--gpus", "8", "--workload", "latency:512:16"])
    assert capsys.readouterr().out.splitlines()[1:4] == ["", line + ".", ""]
    main(["--model-path", qwen3_8b, "--gpus", "8", "--workload", "latency:512:16", "--json"])
    assert json.loads(capsys.readouterr().out)["extrapolation"] == line
    for n in MEASURED_GPU_COUNTS:
        assert extrapolation(n) is None and "extrapolation" not in plan(qwen3_8b, n, "H200", "latency:512:16")
        main(["--model-path", qwen3_8b, "--gpus", str(n), "--workload", "latency:512:16"])
        assert "extrapolation" not in capsys.readouterr().out


def test_decode_graphs_past_a_table_are_named_in_the_row_and_under_the_table(qwen3_8b, capsys):
    """A server whose decode graphs run more rows than its shard's table timed (SGLang's TP4 captures 512 rows on
    H100, whose bundled tables stop at 256) is priced along the table's slope and says so; on H200, whose tables reach
    512 rows, nothing is said."""
    by = {c.name: c for c in plan(qwen3_8b, 4, "H100", "latency:512:16")["configurations"]}
    assert by["tp4"].graphs_past_calibration == ("decode steps of 257-512 rows in CUDA graphs priced along the slope of "
                                                 "the calibration's two largest batches (forward's table ends at 256)")
    assert by["dp4"].graphs_past_calibration is None  # SGLang's TP1 server captures 256 rows: its table reaches them
    h200 = plan(qwen3_8b, 4, "H200", "latency:512:16")["configurations"]
    assert all(c.graphs_past_calibration is None for c in h200)
    main(["--model-path", qwen3_8b, "--gpus", "4", "--gpu", "H100", "--workload", "latency:512:16"])
    out = capsys.readouterr().out
    assert (f"Past the calibrations (python -m sgl_sidp.plan calibrate --model-path {qwen3_8b} --gpus 4 times them):"
            in out and "\n- tp4: decode steps of 257-512 rows" in out)


@pytest.mark.parametrize("args, says", [
    (["--model-path", "/nonexistent", "--gpus", "2"], "no config.json there"),
    (["--gpus", "2", "--gpu", "A10"], "known kinds are"),
    (["--gpus", "2", "--workload", "burst:3"], "expected offline:S:IN:OUT"),
    (["--gpus", "2", "--workload", "trace:/nonexistent.csv"], "--workload trace:/nonexistent.csv"),
    (["--gpus", "0"], "at least 1"),
    (["--gpus", "2", "--workload", "latency:0:0"], "IN 0, OUT 0: each at least 1"),
    (["--gpus", "2", "--slo-ttft-ms", "1000"], "--slo-ttft-ms and --slo-tpot-ms go together"),
    (["--gpus", "2", "--slo-ttft-ms", "0", "--slo-tpot-ms", "50"], "both must be above 0"),
])
def test_bad_input_is_one_line_and_exit_2(qwen3_8b, args, says):
    argv = args if "--model-path" in args else ["--model-path", qwen3_8b, *args]
    out = subprocess.run([sys.executable, "-m", "sgl_sidp.plan", *argv], capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("sgl-sidp plan: error: ") and says in lines[0], out.stderr


@pytest.mark.parametrize("spec, says", [
    ("offline:0:2048:256", "S 0: each at least 1"),
    ("offline:8:0:256", "IN 0: each at least 1"),
    ("offline:8:2048:0", "OUT 0: each at least 1"),
    ("offline:8:2048", "expected offline:S:IN:OUT"),
    ("latency:2048:-1", "OUT -1: each at least 1"),
    ("latency:1:2:3", "expected latency:IN:OUT"),
    ("trace:x.csv:0", "SCALE 0: the arrival times' factor must be a positive number"),
    ("trace:x.csv:nan", "SCALE nan"),
    ("trace:x.csv:-2", "SCALE -2"),
])
def test_a_workload_that_cannot_run_is_an_error(spec, says):
    """A request SGLang cannot serve (no prompt token), one that has no TPOT (no output token), no requests at all, or a
    trace's arrival factor that is not a positive number: one line naming the spec, before any trace is read."""
    from sgl_sidp.plan.planner import PlanError, workload

    with pytest.raises(PlanError) as e:
        workload(spec)
    assert str(e.value).startswith(f"--workload {spec}: ") and says in str(e.value)
    assert [(r.input_len, r.output_len) for r in workload("offline:2:16:4")] == [(16, 4), (16, 4)]
    assert [(r.input_len, r.output_len) for r in workload("latency:16:4")] == [(16, 4)]


def test_no_calibration_of_any_shard_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 4096}))
    with pytest.raises(SystemExit) as e:
        main(["--model-path", str(tmp_path), "--gpus", "1"])
    assert e.value.code == 2


class _FakeServer:
    """Stands in for a shard's SGLang server: "measures" by writing the cache entry the launcher would."""

    def __init__(self, cache, sig, exits=False):
        self.cache, self.sig, self.exits, self.proc = cache, sig, exits, self

    def poll(self):
        return 1 if self.exits else None

    def start(self):
        if not self.exits:
            entry = {"model": self.sig, "gpu": "NVIDIA H200", "decode_ms": {"1": 5.0}, "prefill_ms": {"512": 9.0}}
            (self.cache / f"{len(list(self.cache.glob('*')))}-{id(self)}.json").write_text(json.dumps({"key": {}, "calibration": entry}))

    def stop(self):
        pass


def test_calibrate_times_each_missing_shard_once(qwen3_8b, tmp_path):
    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.plan.calibrate import calibrate, shards_needed

    needed = shards_needed(read_hf_config(qwen3_8b), 4)  # tp1 (dp4), tp2 (tp2_dp2), tp4, dp4_attn
    assert len(needed) == 4 and all(s.endswith("tp1") for s in needed)
    shapes = ModelShapes.of(read_hf_config(qwen3_8b))
    by_args = {json.dumps(shard.override_args(shapes)): sig for sig, shard in needed.items()}
    started = []

    def server(args, log):
        sig = by_args[args[args.index("--json-model-override-args") + 1]]
        started.append(sig)
        return _FakeServer(tmp_path, sig, exits="I6144" in sig)  # the tp2 shard's server dies

    res = calibrate(qwen3_8b, 4, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False)
    assert sorted(started) == sorted(needed)
    assert sum(v.startswith("measured") for v in res.values()) == 3 and sum(v.startswith("failed") for v in res.values()) == 1
    again = calibrate(qwen3_8b, 4, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False)
    assert sum(v.startswith("cached") for v in again.values()) == 3 and len(started) == 5  # only the failed one retried


def test_timed_graphs_only_captures_the_timed_sizes_with_sglangs_own_flags(qwen3_8b, tmp_path):
    """`plan calibrate` (`--timed-graphs-only`, the default): every shard's server gets `timed_graph_flags`, which
    SGLang 0.5.17's own parser reads as the decode batches and prefill sizes the calibration times;
    `--no-timed-graphs-only` leaves SGLang's defaults."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sgl_sidp.calibration.table import DECODE_BATCHES, PREFILL_TOKENS
    from sgl_sidp.plan.calibrate import calibrate, timed_graph_flags

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    a = parser.parse_args(["--model-path", qwen3_8b, *timed_graph_flags()])
    assert (a.cuda_graph_bs_decode, a.cuda_graph_bs_prefill) == (list(DECODE_BATCHES), list(PREFILL_TOKENS))
    args_seen = []

    def server(args, log):
        args_seen.append(args)
        return _FakeServer(tmp_path, "x", exits=True)

    calibrate(qwen3_8b, 1, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False)
    calibrate(qwen3_8b, 1, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False,
              timed_graphs_only=False)
    assert len(args_seen) == 2
    assert " ".join(timed_graph_flags()) in " ".join(args_seen[0]) and "--cuda-graph-bs" not in " ".join(args_seen[1])


class _GatedServer(_FakeServer):
    """A stand-in shard server that records, in `events`, when it starts, when it reaches its `--overlay-start-after`
    gate (`calibration.gate.reached`, after `start_up` looks at it), when it would take the GPU (the gate file exists)
    and when it stops."""

    def __init__(self, cache, sig, args, events, start_up=0):
        super().__init__(cache, sig)
        self.events, self.name, self.start_up = events, sig, start_up
        self.gate = Path(args[args.index("--overlay-start-after") + 1])

    def start(self):
        self.events.append(("start", self.name, self.gate.exists()))

    def poll(self):  # reaches its gate after `start_up` polls; takes the GPU once the gate is open; 3 polls later its
        # calibration is cached
        from sgl_sidp.calibration.gate import reached

        self.start_up -= 1
        if self.start_up < 0 and not Path(reached(self.gate)).exists():
            Path(reached(self.gate)).touch()
            self.events.append(("reached", self.name))
        elif Path(reached(self.gate)).exists() and self.gate.exists() and ("gpu", self.name) not in self.events:
            self.events.append(("gpu", self.name))
            self.measuring = 3
        elif getattr(self, "measuring", 0):
            self.measuring -= 1
            if not self.measuring:
                super().start()
        return None

    def stop(self):
        self.events.append(("stop", self.name))


def _serve_stand_ins(tmp_path, ahead, start_up=0):
    """`serve_calibrations` of three stand-in shards (`_GatedServer`), each `start_up` polls from start to its gate:
    (the events, the results)."""
    from sgl_sidp.plan.calibrate import serve_calibrations

    events = []
    jobs = [(f"M L{i} tp1", ["--json-model-override-args", json.dumps({"num_hidden_layers": i})], tmp_path / f"{i}.log")
            for i in (1, 2, 3)]

    def server(args, log):
        sig = f"M L{json.loads(args[args.index('--json-model-override-args') + 1])['num_hidden_layers']} tp1"
        return _GatedServer(tmp_path, sig, args, events, start_up)

    import sgl_sidp.plan.calibrate as cal_mod
    real = cal_mod.find_calibration, cal_mod.POLL_S
    try:  # the stand-in entries carry their signature as "model"
        cal_mod.find_calibration = lambda sig, gpu, dirs: next(
            ((SimpleNamespace(source="stand-in"), f) for f in Path(dirs[0]).glob("*.json")
             if json.loads(f.read_text())["calibration"]["model"] == sig),
            None)
        cal_mod.POLL_S = 0.01
        res = serve_calibrations("m", jobs, "NVIDIA H200", tmp_path, server, timeout_s=10, measure_overhead=False,
                                 ahead=ahead)
    finally:
        cal_mod.find_calibration, cal_mod.POLL_S = real
    return events, res


@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_the_next_shards_server_starts_while_the_current_one_is_measured(tmp_path, ahead):
    """`serve_calibrations`: the `ahead` servers after the current one start while it is measured, behind a gate
    file that appears only after the current server stopped, so two servers never use the GPU at once; with `ahead`
    0, each server starts after the one before stopped, its gate open. Gate files are removed at the end."""
    events, res = _serve_stand_ins(tmp_path, ahead)
    assert all(what.startswith("measured") for what, _ in res.values()), res
    gpu_order = [e for e in events if e[0] in ("gpu", "stop")]
    assert gpu_order == [("gpu", "M L1 tp1"), ("stop", "M L1 tp1"), ("gpu", "M L2 tp1"), ("stop", "M L2 tp1"),
                         ("gpu", "M L3 tp1"), ("stop", "M L3 tp1")]  # one server on the GPU at a time
    starts = {name: (events.index(("start", name, open_)), open_) for _, name, open_ in
              (e for e in events if e[0] == "start")}
    assert [open_ for _, open_ in starts.values()] == [True, ahead == 0, ahead == 0]
    stop_l1 = events.index(("stop", "M L1 tp1"))
    assert (starts["M L2 tp1"][0] < stop_l1) == (ahead >= 1)  # L2 started while L1 was measured
    assert (starts["M L3 tp1"][0] < stop_l1) == (ahead >= 2)  # and L3 too, two ahead
    assert not list(tmp_path.glob(".start-after-*"))


def test_the_second_waiting_server_starts_once_the_first_server_reached_its_gate(tmp_path):
    """Two servers ahead, each taking a few polls to its gate: L2 starts with L1, L3 only once L1 reached its gate
    (two CPU start-ups at a time, not three, beside the first one's), still before L1 stops."""
    events, res = _serve_stand_ins(tmp_path, 2, start_up=3)
    assert all(what.startswith("measured") for what, _ in res.values()), res
    at = {e[:2]: i for i, e in enumerate(events)}
    assert at[("start", "M L2 tp1")] < at[("reached", "M L1 tp1")] < at[("start", "M L3 tp1")] < at[("stop", "M L1 tp1")]


def test_the_two_layer_counts_of_a_shard_too_big_for_the_gpu_run_only_the_probes_its_entry_reads(monkeypatch,
                                                                                              tmp_path):
    """Llama-3.1-70B's TP1 shard on one H200 is served at 20 and 40 layers: the first runs the request overhead and
    prefix prefills, the second also the serving step; every whole shard runs all of `PROBES`."""
    from sgl_sidp.plan import calibrate as cal

    llama = MODELS / "Llama-3.1-70B"
    if not (llama / "config.json").is_file():
        pytest.skip(f"{llama} missing (../shared/models)")
    seen = {}

    def serve(model, jobs, *a, **k):
        seen.update({j[0]: j[3] for j in jobs})
        return {j[0]: ("failed: a stand-in", None) for j in jobs}

    monkeypatch.setattr(cal, "serve_calibrations", serve)
    cal.calibrate(str(llama), 2, "NVIDIA H200", cache_dir=tmp_path, gpu_bytes=143771 * 2**20)
    parts = {sig: probes for sig, probes in seen.items() if " L80 " not in sig}
    assert [p for _, p in sorted(parts.items(), key=lambda kv: int(kv[0].split()[1][1:]))] == list(cal.PART_PROBES)
    assert all(p == cal.PROBES for sig, p in seen.items() if " L80 " in sig) and len(seen) == len(parts) + 2


@pytest.mark.parametrize("flags, says", [(["--gpus", "1", "--servers-ahead", "-1"], "--servers-ahead -1: at least 0"),
                                         (["--gpus", "0"], "--gpus 0: at least 1"),
                                         (["--gpus", "2,x"], "--gpus 2,x: expected N or N,N,... (whole numbers)")])
def test_calibrate_refuses_a_bad_count_in_one_line(qwen3_8b, capsys, flags, says):
    """Before looking for a GPU: `--gpus 0` would calibrate nothing and say nothing."""
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--model-path", qwen3_8b, *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == [f"sgl-sidp plan calibrate: error: {says}"]


def test_a_scheduler_waits_for_its_start_after_file_and_gives_up_with_one_line(tmp_path):
    """`--overlay-start-after FILE` (`calibration.gate.StartGate`, BEFORE `ModelRunner.init_torch_distributed`):
    makes `reached(FILE)` and returns its arguments once FILE appears; without FILE it raises one line after its
    timeout. A FILE whose folder
    does not exist is refused with the settings."""
    import threading

    from sgl_sidp.calibration.gate import StartGate, reached
    from sgl_sidp.config import SidpConfig, SidpConfigError
    from sgl_sidp.hooks import hooks_for

    gate = tmp_path / "open"
    threading.Timer(0.3, gate.touch).start()
    t0 = time.monotonic()
    assert StartGate(path=str(gate), poll_s=0.02).wait("runner", k=1) == (("runner",), {"k": 1})
    assert time.monotonic() - t0 >= 0.25 and Path(reached(gate)).exists()  # it said it got there
    with pytest.raises(RuntimeError, match="did not appear within 0 s"):
        StartGate(path=str(tmp_path / "never"), timeout_s=0.1, poll_s=0.02).wait()
    cfg = SidpConfig.from_mapping({"start_after": str(gate)})
    assert cfg.active and "ModelRunner.init_torch_distributed" in [h.short_name for h in hooks_for(cfg)]
    assert "ModelRunner.init_torch_distributed" not in [h.short_name for h in hooks_for(SidpConfig())]
    with pytest.raises(SidpConfigError) as e:
        SidpConfig.from_mapping({"start_after": str(tmp_path / "no" / "file")})
    assert e.value.problems == [f"--overlay-start-after: the folder of {tmp_path / 'no' / 'file'} does not exist, so "
                                "the file can never appear"]


def test_the_serving_step_probe_times_only_the_gaps_while_every_request_decodes():
    """`all_running_gaps`: requests that start streaming at different times; only gaps between the last first token
    and the first last token count."""
    from types import SimpleNamespace as R

    from sgl_sidp.plan.calibrate import all_running_gaps

    a = R(start_time=0.0, ttft=1.0, itl=[1.0, 1.0, 1.0, 1.0])  # tokens at 1, 2, 3, 4, 5
    b = R(start_time=1.0, ttft=1.5, itl=[0.5, 0.5, 3.0])  # tokens at 2.5, 3, 3.5, 6.5
    assert all_running_gaps([a, b]) == [1.0, 1.0, 0.5, 0.5]  # between 2.5 and 5: a's 3->4, 4->5; b's 2.5->3, 3->3.5


def test_a_shard_too_big_for_the_gpu_is_timed_at_fewer_layers_and_extrapolated(tmp_path):
    """Llama-3.1-70B's whole model (141 GB) on one H200: `calibrate` serves L20 and L40 versions of it and writes an L80
    entry whose every point lies on the line through theirs; shards that fit are served whole."""
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.plan.calibrate import calibrate, layers_that_fit, shards_needed
    from sgl_sidp.plan.steps import find_calibration

    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}))
    hf = read_hf_config(str(model))
    h200 = 143771 * 2**20
    assert [layers_that_fit(hf, s, h200) for s in shards_needed(hf, 2).values()] == [40, 80, 80]  # tp1, tp2, dp2-attn
    cache = tmp_path / "cache"
    cache.mkdir()
    served = []

    class Server(_FakeServer):
        def start(self):  # a forward costs 1 ms + 0.1 ms per layer (decode), 10 + 2 per layer (prefill)
            n = int(self.sig.split()[1][1:])
            entry = {"model": self.sig, "gpu": "NVIDIA H200", "decode_ms": {"1": 1 + 0.1 * n},
                     "prefill_ms": {"512": 10 + 2 * n}, "decode_context": {"1": 256},
                     "prefill_prefix_ms": [[2048, 8192, 20 + 3 * n]] + ([[64, 128, 1.0]] if n == 40 else []),
                     "prefill_multi_ms": [[2, 4096, 30 + 4 * n]]}
            key = {"gpu": "NVIDIA H200", "model": self.sig, "dtype": "torch.bfloat16", "quantization": "",
                   "attention_backend": "triton", "sglang": "0.5.17", "format": 2}
            (self.cache / f"{len(served)}.json").write_text(json.dumps({"key": key, "calibration": entry}))

    def server(args, log):
        sig = "LlamaForCausalLM L{} ...".format(json.loads(args[args.index("--json-model-override-args") + 1])
                                                .get("num_hidden_layers", 80))
        served.append(sig)
        return Server(cache, sig)

    # the fake entries carry only the layer count in their signature: map each real signature to it
    import sgl_sidp.plan.calibrate as cal_mod
    real = cal_mod.find_calibration
    try:
        cal_mod.find_calibration = lambda sig, gpu, dirs: real(" ".join(sig.split()[:2]) + " ...", gpu, dirs)
        res = calibrate(str(model), 2, "NVIDIA H200", cache_dir=cache, server=server, measure_overhead=False,
                        gpu_bytes=h200)
    finally:
        cal_mod.find_calibration = real
    assert served[:2] == ["LlamaForCausalLM L20 ...", "LlamaForCausalLM L40 ..."]
    whole = next(sig for sig in res if "I28672" in sig)
    assert res[whole].startswith("extrapolated from 20 and 40 layers")
    cal = find_calibration(whole, "NVIDIA H200", [cache])[0]
    assert cal.decode_ms[1] == pytest.approx(1 + 0.1 * 80) and cal.prefill_ms[512] == pytest.approx(10 + 2 * 80)
    assert cal.prefill_prefix_ms == ((2048, 8192, pytest.approx(20 + 3 * 80)),)  # (points of both layer counts only)
    assert cal.prefill_multi_ms == ((2, 4096, pytest.approx(30 + 4 * 80)),)
    assert "extrapolated linearly in the layer count to 80 layers" in cal.source


def test_extrapolate_layers_refuses_one_layer_count():
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.plan.calibrate import extrapolate_layers

    c = Calibration(model="m", gpu="g", decode_ms={1: 2.0}, prefill_ms={}, copy_gbps=None, source="s")
    with pytest.raises(ValueError, match="two layer counts"):
        extrapolate_layers(c, c, 40, 40, 80, "m")


def test_measure_comm_takes_the_all_reduce_from_tp_forwards_of_a_calibrated_model(qwen3_8b, tmp_path, monkeypatch,
                                                                                 capsys):
    """`measure-comm --model-path`: each TP size's shard must be calibrated before anything runs (one line, exit 2,
    naming `plan calibrate`); `forward_all_reduce` serves the model at --tp-size 2 and fits what its forwards take over
    the shard's."""
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.model_info import model_signature, read_hf_config
    from sgl_sidp.peer import topology
    from sgl_sidp.plan.__main__ import main
    from sgl_sidp.plan.calibrate import forward_all_reduce, tp_shard_calibrations

    monkeypatch.setattr(topology, "visible_gpu_count", lambda: 2)
    monkeypatch.setattr(topology, "gpu_name", lambda i: "NVIDIA A100-SXM4-80GB")  # no A100 shard is bundled
    with pytest.raises(SystemExit) as e:
        main(["measure-comm", "--gpus", "2", "--model-path", qwen3_8b])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "TP2 shard" in err[0] and "plan calibrate" in err[0], err

    shards = tp_shard_calibrations(qwen3_8b, 2, "NVIDIA H200")  # the bundled TP2 shard
    shard, hf = shards[2], read_hf_config(qwen3_8b)
    extra = lambda tokens: 72 * (2.0 + tokens * 4096 * 2 / 300e3) / 1e3  # noqa: E731  2 x 36 all-reduces
    started = []

    class TP2Server(_FakeServer):
        def start(self):
            real = Calibration(model=model_signature(hf, 2), gpu="NVIDIA H200",
                               decode_ms={b: ms + extra(b) for b, ms in shard.decode_ms.items()},
                               prefill_ms={t: ms + extra(t) for t, ms in shard.prefill_ms.items()}, copy_gbps=None,
                               source="test")
            (self.cache / "tp2.json").write_text(json.dumps({"key": {}, "calibration": real.to_json()}))

    def server(args, log):
        started.append(args[args.index("--tp-size") + 1])
        return TP2Server(tmp_path, "")

    links = forward_all_reduce(qwen3_8b, shards, "NVIDIA H200", cache_dir=tmp_path, server=server)
    assert started == ["2"] and links[2]["latency_us"] == pytest.approx(2.0, abs=1e-6)
    assert links[2]["busbw_gbps"] == pytest.approx(300.0, rel=1e-6) and "TP2 forwards" in links[2]["source"]


def test_prefix_prefills_are_timed_over_a_radix_hit_less_the_request_overhead(tmp_path):
    """`record_prefix_prefills` against a stand-in SGLang (its radix cache never evicts, `cached_tokens` reported):
    every prompt starts with the same tokens; a probe whose prefix is all that was sent extends it, one whose prefix is
    shorter adds tokens of its own, one whose prefix is longer sends it first. Each records (new, cached, client TTFT -
    request overhead); a probe the server does not serve from its cache is left out."""
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.plan.calibrate import record_prefix_prefills
    from tests.test_replay import FakeSGLangServer

    class NoCache(FakeSGLangServer):
        def _cached(self, ids):
            return 0 if len(ids) == 300 else super()._cached(ids)

    entry = tmp_path / "e.json"
    table = {"model": "m", "gpu": "NVIDIA H200", "decode_ms": {"1": 1.0}, "prefill_ms": {"512": 9.0}}
    entry.write_text(json.dumps({"key": {}, "calibration": table}))
    with NoCache() as server:
        srv = type("Srv", (), {"base_url": server.base_url})
        assert record_prefix_prefills(srv, entry).startswith("prefix prefills not measured")
        entry.write_text(json.dumps({"key": {}, "calibration": table, "request_overhead_ms": {"median_ms": 2.5}}))
        assert record_prefix_prefills(srv, entry, [(64, 256), (36, 320), (100, 200), (8, 128), (4, 400)]) == \
            "4 of 5 prefills over a cached prefix"
        sent = [body["input_ids"] for _, body in server.arrivals]
    assert [len(ids) for ids in sent] == [256, 320, 356, 300, 136, 400, 404]
    assert all(ids[:128] == sent[0][:128] for ids in sent) and sent[2][:320] == sent[1] and sent[5][:356] == sent[2]
    assert sent[3][200:] != sent[2][200:300] and sent[4][128:] != sent[2][128:136]  # tokens of their own
    data = json.loads(entry.read_text())
    probes = data["prefix_prefills"]["probes"]
    assert [(p["new"], p["prefix"], p["cached_tokens"]) for p in probes] == [
        (64, 256, 256), (36, 320, 320), (100, 200, 0), (8, 128, 128), (4, 400, 400)]
    rows = data["calibration"]["prefill_prefix_ms"]
    assert [r[:2] for r in rows] == [[64, 256], [36, 320], [8, 128], [4, 400]]
    assert [r[2] for r in rows] == pytest.approx([probes[i]["client_ttft_ms"] - 2.5 for i in (0, 1, 3, 4)], abs=2e-3)
    assert Calibration.from_entry(data).prefill_prefix_ms == tuple(map(tuple, data["calibration"]["prefill_prefix_ms"]))


def test_the_served_step_against_the_eager_forward_gives_the_host_time_per_request(tmp_path):
    """`record_serving_step` against a stand-in SGLang that streams a token every 5 ms: the median gap of the second
    half of the outputs is the served step; (step - the calibrated eager forward at that batch) / batch, at least 0,
    is `host_ms_per_request`. Without eager points it measures nothing."""
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.plan.calibrate import record_serving_step
    from tests.test_replay import FakeSGLangServer

    entry = tmp_path / "e.json"
    table = {"model": "m", "gpu": "NVIDIA H200", "decode_ms": {"1": 1.0}, "prefill_ms": {"512": 9.0}}
    entry.write_text(json.dumps({"key": {}, "calibration": table}))
    with FakeSGLangServer(token_interval_s=0.005) as server:
        srv = type("Srv", (), {"base_url": server.base_url})
        assert record_serving_step(srv, entry, (8, 4, 10)) == "serving step not measured (no eager points)"
        for eager_ms in (1.0, 500.0):
            entry.write_text(json.dumps({"key": {}, "calibration": table | {"decode_ms_eager": {"4": eager_ms,
                                                                                                "16": eager_ms}}}))
            assert record_serving_step(srv, entry, (8, 4, 10)).startswith("served step at batch 8")
            data = json.loads(entry.read_text())
            step = data["serving_step"]["step_ms_median"]
            assert step >= 5.0 and data["serving_step"]["eager_forward_ms"] == eager_ms
            assert Calibration.from_entry(data).host_ms_per_request == pytest.approx(max(0.0, (step - eager_ms) / 8))
    assert len(server.arrivals) == 16 and all(len(b["input_ids"]) == 4 for _, b in server.arrivals)


def test_a_serving_step_burst_whose_requests_never_all_decoded_together_is_sent_again_longer(tmp_path, monkeypatch):
    """`record_serving_step`: where the first burst's requests never all decoded together (they arrived too slowly),
    a second burst decodes `BURST_RETRY` times as many tokens; after two such bursts it measures nothing."""
    from sgl_sidp.plan import calibrate
    from tests.test_replay import FakeSGLangServer

    entry = tmp_path / "e.json"
    table = {"model": "m", "gpu": "NVIDIA H200", "decode_ms": {"1": 1.0}, "prefill_ms": {"512": 9.0},
             "decode_ms_eager": {"4": 500.0, "16": 500.0}}
    real, bursts = calibrate.all_running_gaps, []
    with FakeSGLangServer(token_interval_s=0.002) as server:
        srv = type("Srv", (), {"base_url": server.base_url})
        for never in (1, 2):
            entry.write_text(json.dumps({"key": {}, "calibration": table}))
            monkeypatch.setattr(calibrate, "all_running_gaps",
                                lambda outs: (bursts.append(len(outs[0].itl) + 1), [] if len(bursts) <= never else real(outs))[1])
            bursts.clear()
            what = calibrate.record_serving_step(srv, entry, (8, 4, 10))
            if never == 1:
                assert what.endswith("(a second burst of 30 tokens: the first one's requests never all decoded together)")
                assert json.loads(entry.read_text())["serving_step"]["bursts"] == 2
            else:
                assert what == "serving step not measured (the requests never all decoded together, in two bursts)"
            assert bursts == [10, 30]


def test_the_stream_rate_probe_tells_a_bound_stream_from_a_fast_one(tmp_path):
    """`record_stream_rate` against a stand-in SGLang streaming a token every 5 ms per request (8 requests: about
    1,600 tokens/s): against a calibrated GPU step of 0.1 ms at batch 8 (80,000 tokens/s) the stream bounds it and its
    rate is recorded; against 100 ms (80 tokens/s) it does not, and the rate is left None."""
    from sgl_sidp.plan.calibrate import record_stream_rate
    from tests.test_replay import FakeSGLangServer

    entry = tmp_path / "e.json"
    with FakeSGLangServer(token_interval_s=0.005) as server:
        srv = type("Srv", (), {"base_url": server.base_url})
        for step_ms, bound in ((0.1, True), (100.0, False)):
            table = {"model": "m", "gpu": "NVIDIA H200", "decode_ms": {"8": step_ms}, "prefill_ms": {"512": 9.0}}
            entry.write_text(json.dumps({"key": {}, "calibration": table}))
            assert ("(the stream bounds it)" in record_stream_rate(srv, entry, (8, 4, 40))) is bound
            stream = json.loads(entry.read_text())["stream"]
            assert 800 < stream["delivered_tokens_per_s"] < 2000 and stream["gpu_tokens_per_s"] == pytest.approx(8e3 / step_ms)
            assert stream["tokens_per_s"] == (stream["delivered_tokens_per_s"] if bound else None)
        table["decode_ms"] = {"1": 1.0}
        entry.write_text(json.dumps({"key": {}, "calibration": table}))
        assert record_stream_rate(srv, entry, (8, 4, 40)).startswith("stream rate not measured")


def test_the_stream_rate_is_taken_while_every_request_decodes_and_a_short_window_sends_a_longer_burst(tmp_path,
                                                                                                     monkeypatch):
    """`record_stream_rate` counts the tokens received between the last request's first token and the first one's
    last (`all_running_window`), not during the burst's ramp; where that window holds fewer than
    `STREAM_PROBE_WINDOW_TOKENS` tokens a request, a second burst decodes `BURST_RETRY` times as many; after
    two such bursts it measures nothing."""
    from sgl_sidp.plan import calibrate
    from tests.test_replay import FakeSGLangServer

    assert calibrate.all_running_window([[1.0, 2.0, 5.0], [3.0, 4.0, 6.0]]) == (3.0, 5.0)
    entry = tmp_path / "e.json"
    table = {"model": "m", "gpu": "NVIDIA H200", "decode_ms": {"8": 0.1}, "prefill_ms": {"512": 9.0}}
    real, bursts = calibrate.all_running_window, []
    with FakeSGLangServer(token_interval_s=0.005) as server:
        srv = type("Srv", (), {"base_url": server.base_url})
        for never in (1, 2):
            entry.write_text(json.dumps({"key": {}, "calibration": table}))
            monkeypatch.setattr(calibrate, "all_running_window", lambda times: (
                bursts.append(len(times[0])), (0.0, 0.0) if len(bursts) <= never else real(times))[1])
            bursts.clear()
            what = calibrate.record_stream_rate(srv, entry, (8, 4, 12))
            assert bursts == [12, 36]
            if never == 1:
                assert what.endswith("(the stream bounds it) (a second burst of 36 tokens)"), what
                stream = json.loads(entry.read_text())["stream"]
                assert stream["bursts"] == 2 and stream["probe"] == [8, 4, 36] and 0.1 < stream["window_s"] < 1.0
                assert 300 < stream["delivered_tokens_per_s"] < 1700  # 8 requests, a token each every 5 ms at most
            else:
                assert what == "stream rate not measured (the requests never all decoded together long enough, in two bursts)"


def test_plan_delivers_through_the_measured_stream_rate(qwen3_8b, tmp_path):
    """A calibration entry with a measured stream rate (`stream.tokens_per_s`) slows what clients see of a burst on
    two DP replicas, and the result names the rate (the bundled entries' rates left out here)."""
    from sgl_sidp.calibration.cache import BUNDLED_DIR

    for f in BUNDLED_DIR.glob("h200_qwen3-8b_*.json"):
        data = json.loads(f.read_text())
        data.pop("stream", None)
        (tmp_path / f.name).write_text(json.dumps(data))
    before = {c.name: c for c in plan(qwen3_8b, 2, "H200", "offline:256:512:256", [tmp_path])["configurations"]}
    entry = tmp_path / "h200_qwen3-8b_tp1.json"
    data = json.loads(entry.read_text())
    data["stream"] = {"tokens_per_s": 5000.0}
    entry.write_text(json.dumps(data))
    r = plan(qwen3_8b, 2, "H200", "offline:256:512:256", [tmp_path])
    after = {c.name: c for c in r["configurations"]}
    assert r["stream_tokens_per_s"] == 5000.0
    assert after["dp2"].total_tok_s < 0.9 * before["dp2"].total_tok_s
    assert after["dp2"].tpot_ms_p50 > before["dp2"].tpot_ms_p50


def test_the_stream_length_probe_times_a_longer_burst_after_the_shorter_one(tmp_path):
    """`record_stream_length` against the stand-in (a token every 5 ms per request: about 1,600 tokens/s for 8
    requests): after the shorter probe measured the stream it writes the rate at its longer output into
    "stream"["long"]; where that probe measured nothing, it measures nothing either and says why in one line."""
    from sgl_sidp.plan.calibrate import record_stream_length
    from tests.test_replay import FakeSGLangServer

    entry = tmp_path / "e.json"
    table = {"model": "m", "gpu": "NVIDIA H200", "decode_ms": {"8": 0.1}, "prefill_ms": {"512": 9.0}}
    with FakeSGLangServer(token_interval_s=0.005) as server:
        srv = type("Srv", (), {"base_url": server.base_url})
        entry.write_text(json.dumps({"key": {}, "calibration": table}))
        assert record_stream_length(srv, entry, (8, 4, 60)) == (
            "stream length not measured (the shorter probe measured no stream)")
        entry.write_text(json.dumps({"key": {}, "calibration": table, "stream": {
            "tokens_per_s": None, "delivered_tokens_per_s": 1500.0, "probe": [8, 4, 20]}}))
        what = record_stream_length(srv, entry, (8, 4, 60))
    long = json.loads(entry.read_text())["stream"]["long"]
    assert what.endswith("at 60 tokens a request (the stream bounds it)"), what
    assert long["probe"] == [8, 4, 60] and 800 < long["tokens_per_s"] == long["delivered_tokens_per_s"] < 2000


def test_the_stream_slows_with_the_output_so_far_where_two_lengths_were_measured():
    """`stream_rate_at`: with bound rates at 128 and 512 tokens a request (mean places 64.5 and 256.5), a token costs
    c0 + c1 x its place, so the rate at a place is between and beyond them on that line; one rate alone is the rate
    at any place; no bound rate raises. `output_mean_index` is the mean place of a workload's output tokens."""
    from sgl_sidp.plan.steps import output_mean_index, stream_rate_at

    stream = {"tokens_per_s": 24000.0, "probe": [256, 16, 128],
              "long": {"tokens_per_s": 12000.0, "probe": [256, 16, 512]}}
    assert stream_rate_at(stream, 64.5) == pytest.approx(24000.0)
    assert stream_rate_at(stream, 256.5) == pytest.approx(12000.0)
    c1 = (1 / 12000 - 1 / 24000) / 192
    assert stream_rate_at(stream, 1.0) == pytest.approx(1 / (1 / 24000 - 63.5 * c1))
    assert stream_rate_at(stream) == 24000.0 and stream_rate_at({"tokens_per_s": 9000.0}, 300.0) == 9000.0
    assert stream_rate_at(stream | {"long": {"tokens_per_s": None}}, 300.0) == 24000.0
    # the shorter probe bounded by the GPU: its delivered rate stands in for the stream's there
    gpu_bound = stream | {"tokens_per_s": None, "delivered_tokens_per_s": 24000.0}
    assert stream_rate_at(gpu_bound, 256.5) == pytest.approx(12000.0) and stream_rate_at(gpu_bound, 64.5) == 24000.0
    with pytest.raises(TypeError):
        stream_rate_at({"tokens_per_s": None}, 10.0)
    with pytest.raises(TypeError):
        stream_rate_at(gpu_bound)  # no place: the shorter probe's bound rate, which it has not
    assert output_mean_index([512] * 4) == 256.5 and output_mean_index([1, 3]) == pytest.approx(7 / 4)
    assert output_mean_index([]) == 1.0


def test_plan_streams_a_long_output_burst_at_the_rate_of_its_length(qwen3_8b, tmp_path):
    """A calibration entry with bound stream rates at two output lengths gives a burst of 512 output tokens a request
    the rate at its mean place, 256.5 (the rate the entry measured there), and one of 128 tokens its own."""
    from sgl_sidp.calibration.cache import BUNDLED_DIR

    for f in BUNDLED_DIR.glob("h200_qwen3-8b_*.json"):
        data = json.loads(f.read_text())
        data.pop("stream", None)
        (tmp_path / f.name).write_text(json.dumps(data))
    entry = tmp_path / "h200_qwen3-8b_tp1.json"
    data = json.loads(entry.read_text())
    data["stream"] = {"tokens_per_s": 24000.0, "probe": [256, 16, 128],
                      "long": {"tokens_per_s": 12000.0, "probe": [256, 16, 512]}}
    entry.write_text(json.dumps(data))
    assert plan(qwen3_8b, 2, "H200", "offline:64:512:512", [tmp_path])["stream_tokens_per_s"] == pytest.approx(12000.0)
    assert plan(qwen3_8b, 2, "H200", "offline:64:512:128", [tmp_path])["stream_tokens_per_s"] == pytest.approx(24000.0)


def test_a_served_shard_runs_every_http_probe_into_its_cache_entry(tmp_path, monkeypatch):
    """`serve_calibration` end to end against a stand-in SGLang (the "launcher" writes the shard's entry when it
    starts): the request overhead, then the prefix prefills (which take it off), the served eager step and the
    stream rate at two output lengths (the longer cut to the shorter's 256 x 128 tokens here, 384 where a second
    burst is needed), each written into the one cache entry, which still reads as a calibration."""
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.plan import calibrate
    from sgl_sidp.plan.calibrate import PREFIX_PROBES, serve_calibration
    from tests.test_replay import FakeSGLangServer

    monkeypatch.setattr(calibrate, "STREAM_PROBE_LONG", (256, 16, 128))

    sig = "Qwen3ForCausalLM L36 H4096 I12288 A32/8 tp1"
    # eager steps slow enough that the serving probe's 4 s of decode take 100 output tokens (a 2 ms step would
    # stream 2,000 tokens to each of 512 requests: minutes of this CPU)
    table = {"model": sig, "gpu": "NVIDIA H200", "decode_ms": {"256": 0.5}, "prefill_ms": {"512": 1.0, "2048": 2.0},
             "decode_ms_eager": {"256": 40.0, "512": 40.0}, "decode_eager_context": 256}

    class Srv:
        def __init__(self, fake):
            self.fake, self.base_url, self.proc = fake, fake.base_url, self

        def start(self):
            (tmp_path / "entry.json").write_text(json.dumps({"key": {}, "calibration": table}))

        def wait_ready(self):
            return 0.0

        def poll(self):
            return None

        def stop(self):
            pass

    with FakeSGLangServer(token_interval_s=0.002) as fake:
        what, entry = serve_calibration("m", sig, [], "NVIDIA H200", tmp_path, lambda args, log: Srv(fake),
                                        tmp_path / "log", timeout_s=30)
    assert entry == tmp_path / "entry.json" and what.startswith("measured in")
    for part in ("request overhead", f"{len(PREFIX_PROBES)} of {len(PREFIX_PROBES)} prefills over a cached prefix",
                 "served step at batch 512", "stream "):
        assert part in what, what
    data = json.loads(entry.read_text())
    assert {"request_overhead_ms", "prefix_prefills", "serving_step", "stream"} <= set(data)
    cal = Calibration.from_entry(data)
    assert len(cal.prefill_prefix_ms) == len(PREFIX_PROBES) and cal.host_ms_per_request is not None
    assert data["stream"]["tokens_per_s"] == data["stream"]["delivered_tokens_per_s"]  # 512,000 tokens/s offered
    assert "long" in data["stream"], what
    long = data["stream"]["long"]
    assert long["probe"] in ([256, 16, 128], [256, 16, 384]) and long["tokens_per_s"] > 0


def test_a_calibration_server_is_killed_with_its_children_at_once(tmp_path):
    """`ServerProcess(kill_on_stop=True).stop()` (plan calibrate's servers): the whole process group is gone when it
    returns (`group_running`), a child that ignores SIGTERM included, well before SGLang's own shutdown would end."""
    from sgl_sidp.bench.server import ServerProcess, group_running

    (tmp_path / "stand_in_server.py").write_text(
        "import signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen(['sleep', '60'])\n"
        "time.sleep(60)\n")
    srv = ServerProcess("stand_in_server", [], port=1, log_path=tmp_path / "log", env={"PYTHONPATH": str(tmp_path)},
                        kill_on_stop=True).start()
    deadline = time.time() + 10
    while time.time() < deadline and "sleep" not in subprocess.run(
            ["ps", "-o", "comm=", "-g", str(srv.proc.pid)], capture_output=True, text=True).stdout:
        time.sleep(0.05)
    assert group_running(srv.proc.pid)
    t0 = time.time()
    srv.stop()
    assert not group_running(srv.proc.pid) and time.time() - t0 < 5


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_a_group_runs_while_any_thread_of_it_does(tmp_path):
    """`group_running` counts a process whose main thread has exited (Z) while another thread still runs: a killed
    CUDA process frees its GPU memory only when its last thread is gone, and `plan calibrate` opens the next
    server's gate (`calibration.gate`) once the group is not running (the OOM of `--servers-ahead 2`'s first run)."""
    from sgl_sidp.bench.server import group_running

    script = tmp_path / "main_thread_exits.py"
    script.write_text(
        "import ctypes, os, threading, time\n"
        "def last():\n"
        "    time.sleep(1.5)\n"
        "    os._exit(0)\n"
        "threading.Thread(target=last).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)\n")
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    deadline = time.time() + 5
    while time.time() < deadline and len(list(Path(f"/proc/{proc.pid}/task").glob("*"))) != 2:
        time.sleep(0.02)
    while time.time() < deadline and Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.02)
    assert Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # the main thread is gone
    assert group_running(proc.pid)  # ... and the process is not
    proc.wait(10)
    assert not group_running(proc.pid)


def test_plan_calibrate_starts_its_first_server_without_importing_torch(qwen3_8b, tmp_path):
    """Importing torch took `plan calibrate` 6 s on a fresh H200 host before its first server started (the
    calibration's critical path): it reads the timed points from `calibration.table`, not `calibration.measure`."""
    code = f"""
import sys
from sgl_sidp.plan.calibrate import calibrate
seen = []
class Exits:
    def __init__(self): self.proc = self
    def poll(self): return 1
    def start(self): pass
    def stop(self): pass
def server(args, log):
    seen.append("torch" in sys.modules)
    return Exits()
calibrate({qwen3_8b!r}, 2, "NVIDIA H200", cache_dir={str(tmp_path)!r}, server=server, measure_overhead=False)
print(seen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().startswith("[False"), out.stderr[-2000:]


def test_zerodp_replicas_are_routed_as_its_router_routes():
    """The planner sends ZeroDP's requests by the runtime's rule (`zerodp.router.pick_rank` on each simulated
    replica's load); every other configuration keeps SGLang's round robin."""
    from types import SimpleNamespace

    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import route_of

    assert route_of(configuration_named("dp2")) is None and route_of(configuration_named("sidp_dp2_was")) is None
    route = route_of(configuration_named("zerodp_dp2"))
    class Replica:  # what the route reads of a `sim.ReplicaSim` (hashable, weakly referable, as it is)
        def __init__(self, tokens, kv, floor_ms):  # a decode step of 5 ms + 0.1 ms a row, at least floor_ms
            self.load = lambda: (tokens, 0)
            self.limits = SimpleNamespace(kv_tokens=kv)
            self.times = SimpleNamespace(decode_ms=lambda b, ctx: max(5.0 + 0.1 * b, floor_ms))

    def rep(tokens, kv, floor_ms=0.0):
        return Replica(tokens, kv, floor_ms)

    req = SimpleNamespace(input_len=8_192)
    assert route(req, [rep(0, 89_915), rep(0, 647_013)]) == 1  # the least full cache it fits in
    assert route(req, [rep(40_000, 89_915), rep(300_000, 647_013)]) == 1  # 0.54 vs 0.48 of capacity
    assert route(req, [rep(90_000, 89_915), rep(647_000, 647_013)]) == 0  # fits nowhere: the fewest tokens
    assert route(req, [rep(0, 89_915), rep(0, 647_013, floor_ms=146.0)]) == 0  # a copy-bound sink: the source


def test_calibrate_shares_the_shards_among_the_hosts_gpus(qwen3_8b, tmp_path):
    """`plan calibrate` on a host of two GPUs: each GPU times its share of the shards (`split_jobs`, round robin) in a
    thread of its own at the same time, every shard once; when one GPU's calibration raises, the other's stops its
    servers (`stop`) and the error reaches the caller."""
    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.plan.calibrate import calibrate, shards_needed, split_jobs

    assert split_jobs(list("abcde"), 2) == [list("ace"), list("bd")] and split_jobs(["a"], 3) == [["a"], [], []]
    needed = shards_needed(read_hf_config(qwen3_8b), 4)
    assert len(shards_needed(read_hf_config(qwen3_8b), [2, 4])) == len(needed) + 1  # and the DP2-attention shard
    shapes = ModelShapes.of(read_hf_config(qwen3_8b))
    by_args = {json.dumps(shard.override_args(shapes)): sig for sig, shard in needed.items()}
    seen, lock = [], threading.Lock()
    both = threading.Barrier(2, timeout=10)  # each GPU's first server waits for the other's: they run at once

    def server(args, log):
        gpu = threading.current_thread().name
        with lock:
            seen.append(gpu)
            first = seen.count(gpu) == 1
        if first:
            both.wait()
        return _FakeServer(tmp_path, by_args[args[args.index("--json-model-override-args") + 1]])

    res = calibrate(qwen3_8b, 4, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False,
                    gpus=["0", "1"], ahead=0)
    assert len(res) == len(needed) and all(v.startswith("measured") for v in res.values())
    assert sorted(seen) == ["calibrate-gpu0"] * 2 + ["calibrate-gpu1"] * 2

    def failing(args, log):
        if threading.current_thread().name == "calibrate-gpu1":
            raise OSError("no port")
        return _FakeServer(tmp_path / "x", "never written", exits=False)

    (tmp_path / "x").mkdir()
    with pytest.raises(OSError, match="no port"):
        calibrate(qwen3_8b, 4, "NVIDIA H200", cache_dir=tmp_path / "x", server=failing, measure_overhead=False,
                  gpus=["0", "1"], ahead=0, timeout_s=30)


def test_a_technique_within_the_planners_error_of_vanilla_yields_to_it():
    """A technique predicted less than `NEAR_TIE` over the best vanilla configuration is not the winner: vanilla
    SGLang leads, and the reason gives the technique's predicted ratio; at `NEAR_TIE` or more it stays first. Latency
    rankings and vanilla winners are left as they are."""
    from sgl_sidp.plan.planner import NEAR_TIE, PlanRow, prefer_vanilla

    def row(name, technique, tok_s, goodput=None):
        return PlanRow(name=name, technique=technique, variant="", dp=1, tp=1, sp=1, mem_fraction_static=0.9,
                       weights_gb_per_gpu=1.0, kv_tokens_total=1, total_tok_s=tok_s, request_goodput=goodput)

    sidp, tp = row("sidp_dp4_auto", "sidp", 101.0, 2.0), row("tp2_dp2", "vanilla", 100.0, 1.0)
    dp = row("dp4", "vanilla", 90.0, 3.0)
    assert prefer_vanilla([sidp, tp, dp], "throughput") == ([tp, sidp, dp], sidp)
    far = row("sidp_dp4_was", "sidp", 100.0 * (1 + NEAR_TIE), 2.0)
    assert prefer_vanilla([far, tp, dp], "throughput") == ([far, tp, dp], None)
    assert prefer_vanilla([tp, sidp], "throughput") == ([tp, sidp], None)
    assert prefer_vanilla([sidp, tp], "latency") == ([sidp, tp], None)
    assert prefer_vanilla([sidp], "throughput") == ([sidp], None)  # nothing vanilla to yield to
    # goodput: by requests per second, against the vanilla configuration first by goodput
    assert prefer_vanilla([dp, sidp, tp], "goodput") == ([dp, sidp, tp], None)
    near = row("shift_sp4_tp1", "shift", 80.0, 3.1)
    assert prefer_vanilla([near, dp, tp], "goodput") == ([dp, near, tp], near)
    assert prefer_vanilla([row("shift", "shift", 80.0, 1.0), row("tp4", "vanilla", 70.0, 0.0)], "goodput")[1] is None
    models = MODELS / "Llama-3.1-70B"
    if (models / "config.json").is_file():  # bundled H200 tables: SiDP DP4 predicted ~1.01x TP2 x DP2 there
        r = plan(str(models), 4, "H200", "offline:512:2048:16")
        assert r["winner"] == "tp2_dp2" and "sidp_dp4_auto is predicted 1.0" in r["reason"]
        assert "a technique must gain to be started (the planner's error)" in r["reason"]


def test_with_slos_the_configurations_are_ranked_by_goodput(qwen3_8b, capsys):
    """Goodput (requests per second meeting both SLOs) orders the rows, the reason and the table say so; every
    predicted row has it."""
    from sgl_sidp.plan.planner import prefer_vanilla, rank

    result = plan(qwen3_8b, 2, "H200", "offline:64:2048:64", slo=(1000.0, 50.0))
    assert result["objective"] == "goodput"
    ranked = rank(result["configurations"], "goodput")
    assert [r.request_goodput for r in ranked] == sorted((r.request_goodput for r in ranked), reverse=True)
    winner = prefer_vanilla(ranked, "goodput")[0][0]  # a technique within the planner's error yields
    assert result["winner"] == winner.name and "the highest predicted goodput" in result["reason"]
    assert "under TTFT 1000 ms and TPOT 50 ms" in result["reason"]
    main(["--model-path", qwen3_8b, "--gpus", "2", "--workload", "offline:64:2048:64", "--slo-ttft-ms", "1000",
          "--slo-tpot-ms", "50"])
    assert "| goodput req/s |" in capsys.readouterr().out
