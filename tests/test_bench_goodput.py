"""`python -m sgl_sidp.bench.goodput`: a measured replay's goodput under other objectives, from its per-request file,
counted as the replay itself counts it (`compute_metrics`), beside the best vanilla configuration of the same replay."""

import argparse
import csv
import json

import pytest

from sgl_sidp.bench import goodput
from sgl_sidp.bench.metrics import SLO

FIELDS = ["id", "ttft_ms", "tpot_ms", "e2e_ms", "success", "output_len_received"]


def write_replay(folder, config, technique, rows, duration_s=10.0, key="azure_2x"):
    (folder / f"{config}.json").write_text(json.dumps({"config": config, "technique": technique, "gpu_count": 2}))
    d = folder / "traces" / config / key
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"duration": duration_s}))
    with (d / "requests.csv").open("w") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for i, (ttft, tpot, ok) in enumerate(rows):
            w.writerow({"id": i, "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": ttft + 10 * (tpot or 0), "success": ok,
                        "output_len_received": 11 if tpot != "" else 1})


def test_the_gzipped_jsonl_compare_keeps_counts_as_the_csv(tmp_path):
    """compare keeps a replay's requests as `requests.jsonl.gz` alone (the CSV held the same rows uncompressed)."""
    import gzip

    write_replay(tmp_path, "tp2", "vanilla", [(300, 6, True), (2000, 6, True), (100, 5, False)])
    d = tmp_path / "traces" / "tp2" / "azure_2x"
    csv_rows = goodput.replays(tmp_path)["azure@2x"]["tp2"]
    with gzip.open(d / "requests.jsonl.gz", "wt") as f:
        for i, (ttft, tpot, ok) in enumerate([(300, 6, True), (2000, 6, True), (100, 5, False)]):
            f.write(json.dumps({"id": i, "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": ttft + 60, "success": ok}) + "\n")
    (d / "requests.csv").unlink()
    json_rows = goodput.replays(tmp_path)["azure@2x"]["tp2"]
    for slo in (SLO(1000, 10), SLO(5000, 10), SLO(1000, 5)):
        assert goodput.goodput(*json_rows, slo) == goodput.goodput(*csv_rows, slo)


def test_goodput_under_each_objective_beside_the_best_vanilla(tmp_path):
    write_replay(tmp_path, "dp2", "vanilla", [(500, 9, True), (800, 12, True), (1500, 5, True), (100, 5, False)])
    write_replay(tmp_path, "tp2", "vanilla", [(300, 6, True), (2000, 6, True)])
    write_replay(tmp_path, "shift_sp2_tp1", "shift", [(300, 6, True), (400, 7, True), (900, "", True)])
    rows = goodput.replays(tmp_path)["azure@2x"]
    assert goodput.goodput(*rows["dp2"], SLO(1000, 10)) == pytest.approx(0.1)  # late, slow and failed ones out
    assert goodput.goodput(*rows["shift_sp2_tp1"], SLO(1000, 6)) == pytest.approx(0.2)  # a one-token answer: TPOT 0
    table = goodput.table(tmp_path, [SLO(1000, 10), SLO(2000, 50)])
    assert table[0] == "| replay | TTFT / TPOT objectives | dp2 | shift_sp2_tp1 | tp2 |"
    assert table[2] == ("| azure@2x | 1000 / 10 ms | 0.1 (1.00x) [1 of 4] | 0.3 (3.00x) [3 of 3] | 0.1 (1.00x) "
                        "[1 of 2] |")
    assert table[3] == ("| azure@2x | 2000 / 50 ms | 0.3 (1.00x) [3 of 4] | 0.3 (1.00x) [3 of 3] | 0.2 (0.67x) "
                        "[2 of 2] |")


def test_bad_input_gets_one_line(tmp_path, capsys):
    assert goodput.parse_slo("1000/10") == SLO(1000.0, 10.0)
    for bad in ("1000", "a/b", "0/10"):
        with pytest.raises(argparse.ArgumentTypeError):
            goodput.parse_slo(bad)
    with pytest.raises(SystemExit):
        goodput.main([str(tmp_path), "--slo", "1000/10"])
    assert "no trace replay with its per-request file (requests.csv or requests.jsonl.gz) under traces/" in \
        capsys.readouterr().err


def test_a_replayed_trace_not_there_is_one_line_before_any_prediction(tmp_path, capsys):
    """With --model-path the numbers get predictions, which replay the traces compare sent (`validate.missing_trace`,
    as `bench.validate` checks them)."""
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    write_replay(folder, "dp2", "vanilla", [(500, 9, True)])
    (tmp_path / "commands.txt").write_text(
        "2026-11-27T12:35:40+00:00 commit eb46fda: python -m sgl_sidp.bench.compare --model-path m --gpus 0,1 "
        "--configs dp2 --trace .gpu/traces/azure.csv --rates 2 --out-dir o\n")
    with pytest.raises(SystemExit):
        goodput.main([str(folder), "--slo", "1000/10", "--model-path", "m", "--trace-dir", str(tmp_path)])
    assert f"{tmp_path}/azure.csv: the trace a replay here sent is not there" in capsys.readouterr().err


def test_predict_replay_arguments_the_replay_refuses_are_one_error_line(capsys):
    """A REPLAY_ARGS without --trace (or with a flag the replay does not know) is refused as the replay would refuse
    it, in one line under goodput's usage, not with the replay's usage and exit."""
    for bad, why in (("--time-scale 0.5 --duration-s 300", "required: --trace"), ("--trace t.csv --rate 2", "--rate 2")):
        with pytest.raises(SystemExit) as e:
            goodput.main(["--predict", bad, "--model-path", "m", "--gpus", "2", "--slo", "1000/10"])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and "python -m sgl_sidp.replay" not in "\n".join(err)
        assert err[-1].startswith("python -m sgl_sidp.bench.goodput: error: --predict: the replay arguments")
        assert why in err[-1]


def test_one_simulation_counts_every_objective(monkeypatch):
    """`plan_requests(more_slos=...)` counts each objective on the same simulated requests as `slo=` does one at a
    time; `predict` asks for them all at once (one simulation per configuration instead of one per objective)."""
    from pathlib import Path

    from sgl_sidp.plan.planner import plan_requests
    from sgl_sidp.plan.sim import SimRequest

    model = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-8B"
    if not (model / "config.json").is_file():
        pytest.skip(f"{model} missing (../shared/models)")
    reqs = lambda: [SimRequest(0.05 * i, 1024 + 64 * (i % 5), 32) for i in range(40)]  # noqa: E731
    objectives = [(200.0, 12.0), (1000.0, 30.0)]
    together = plan_requests(str(model), 2, "H100", "t", reqs(), names=["tp2", "dp2"], more_slos=objectives)
    rows = {r.name: r for r in together["configurations"] if r.name in ("tp2", "dp2")}
    for t, p in objectives:
        alone = plan_requests(str(model), 2, "H100", "t", reqs(), names=["tp2", "dp2"], slo=(t, p), objective="goodput")
        for r in alone["configurations"]:
            if r.name in rows:
                assert rows[r.name].goodput_by_slo[f"{t:g}/{p:g}"] == pytest.approx(r.request_goodput, abs=0.006)  # 2 decimals
    calls = []
    monkeypatch.setattr("sgl_sidp.plan.planner.plan_requests",
                        lambda *a, **k: calls.append(k["more_slos"]) or together)
    monkeypatch.setattr("sgl_sidp.bench.traces.sim_requests", lambda args, trace_dir: [])
    got = goodput.predict(str(model), "H100", "--x", ["tp2", "dp2"], [SLO(200, 12), SLO(1000, 30)], None, {})
    assert calls == [objectives] and got == [{n: r.goodput_by_slo[k] for n, r in rows.items()}
                                             for k in ("200/12", "1000/30")]


def test_predict_lists_every_configuration_under_each_objective_against_the_best_vanilla(monkeypatch, capsys, tmp_path):
    """`--predict`: before any replay, each configuration's predicted goodput per objective with its ratio to the best
    vanilla configuration's, labelled predicted; bad flag combinations and a trace not there are one line."""
    from types import SimpleNamespace as NS

    monkeypatch.chdir(tmp_path)
    (tmp_path / "T").write_text("")  # the trace --predict names (its requests are stubbed below)

    rows = [NS(name="dp2", technique="vanilla", predicted=True, goodput_by_slo={"1000/10": 1.158, "1000/50": 2.5}),
            NS(name="tp2", technique="vanilla", predicted=True, goodput_by_slo={"1000/10": 0.9, "1000/50": 2.0}),
            NS(name="shift_sp2_tp1", technique="shift", predicted=True,
               goodput_by_slo={"1000/10": 1.468, "1000/50": 2.2}),
            NS(name="dp2_attn", technique="dp_attention", predicted=False, goodput_by_slo=None)]
    asked = []
    monkeypatch.setattr("sgl_sidp.plan.planner.plan_requests",
                        lambda *a, **k: asked.append((a[1], a[2], k["more_slos"])) or {"configurations": rows})
    monkeypatch.setattr("sgl_sidp.bench.traces.sim_requests", lambda args, trace_dir: [])
    goodput.main(["--predict", "--trace T --time-scale 0.333", "--model-path", "M", "--gpus", "2",
                  "--slo", "1000/10", "--slo", "1000/50"])
    out = capsys.readouterr().out
    assert asked == [(2, "H100", [(1000.0, 10.0), (1000.0, 50.0)])]
    assert "Predicted by the planner (2 x H100, replay --trace T --time-scale 0.333); nothing here is measured." in out
    assert "| TTFT / TPOT objectives | dp2 | tp2 | shift_sp2_tp1 |" in out
    assert "| 1000 / 10 ms | 1.16 (1.00x) | 0.9 (0.78x) | 1.47 (1.27x) |" in out
    for argv, why in ((["--slo", "1000/10"], "give DIR"), (["--predict", "x", "--slo", "1000/10"], "needs --model-path"),
                      (["--predict", "--trace U", "--model-path", "M", "--gpus", "2", "--slo", "1000/10"],
                       "U: no such trace (--predict's --trace, in --trace-dir where given)")):
        with pytest.raises(SystemExit):
            goodput.main(argv)
        assert why in capsys.readouterr().err


def test_predict_names_a_shift_server_at_the_threshold_it_ran(monkeypatch):
    """A Shift server that calibrated its own threshold is predicted at it (`compare_report.ran_as`), as
    `bench.validate` predicts it, and its goodput is reported under the folder's configuration name."""
    from types import SimpleNamespace as NS

    rows = [NS(name="tp2", predicted=True, goodput_by_slo={"1000/8": 0.7}),
            NS(name="shift_sp2_tp1_nccl_th1024", predicted=True, goodput_by_slo={"1000/8": 1.2}),
            NS(name="shift_sp2_tp1", predicted=True, goodput_by_slo={"1000/8": 1.3})]
    asked = []
    monkeypatch.setattr("sgl_sidp.plan.planner.plan_requests",
                        lambda *a, **k: asked.append(k["names"]) or {"configurations": rows})
    monkeypatch.setattr("sgl_sidp.bench.traces.sim_requests", lambda args, trace_dir: [])
    results = {"tp2": {"config": "tp2", "technique": "vanilla", "gpu_count": 2},
               "shift_sp2_tp1": {"config": "shift_sp2_tp1", "technique": "shift", "gpu_count": 2,
                                 "shift_threshold": 1024}}
    got = goodput.predict("M", "H100", "--x", ["shift_sp2_tp1", "tp2"], [SLO(1000, 8)], None, results)
    assert asked == [["shift_sp2_tp1_nccl_th1024", "tp2"]]  # a result before "shift_exchange": NCCL's
    assert got == [{"shift_sp2_tp1": 1.2, "tp2": 0.7}]
