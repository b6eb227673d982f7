"""`python -m sgl_sidp.bench.prefix_probes`: a prefix-probe replay request by request beside the planner's TTFT, on
the committed replay of Qwen3-8B's TP2 shard on one H200."""

from pathlib import Path

import pytest

from sgl_sidp.bench.prefix_probes import main, probe_lines
from sgl_sidp.bench.report import read_jsonl
from sgl_sidp.bench.traces import write_prefix_probes

RUN = Path(__file__).resolve().parents[1] / "benchmarks/results/plan/validate_1gpu_h200_prefix_probes_2026-11-29"


def test_each_probe_stands_beside_its_simulated_ttft(tmp_path, capsys):
    trace = write_prefix_probes(tmp_path / "prefix_probes.jsonl")
    shard = RUN / "Qwen3-8B-tp2-shard"
    rows = read_jsonl(shard / "requests.jsonl")
    lines = probe_lines(rows, str(shard), "H200", trace)
    body = [line.split(" | ") for line in lines[2:]]
    assert [b[0].lstrip("| ") for b in body] == ["24,576", "8,192", "8,192", "8,192", "2,048", "2,048", "2,048"]
    assert body[3][1] == "24,576 (24,576, 24,576)"  # the radix cache held every probe's prefix
    assert all(abs(float(b[4].rstrip("%| "))) < 10 for b in body)  # the planner within 10 % on each
    with pytest.raises(ValueError, match="not this trace's replay"):
        probe_lines(rows[:-1], str(shard), "H200", trace)
    main([str(shard / "requests.jsonl.gz"), "--model-path", str(shard), "--trace", str(trace)])
    assert capsys.readouterr().out.splitlines() == lines
    with pytest.raises(SystemExit):
        main([str(shard / "requests.jsonl.gz"), "--model-path", str(shard), "--trace", str(tmp_path / "none")])
    assert "prefix-probes" in capsys.readouterr().err


def test_a_tp2_server_on_two_gpus_is_predicted_as_tp2(tmp_path):
    """The committed replay of TP2 on 2 x H200 against the planner's TP2 (not the first configuration it plans: DP2's
    fresh 24,576-token prompt runs on one GPU, 1.9x TP2's)."""
    trace = write_prefix_probes(tmp_path / "prefix_probes.jsonl")
    run = RUN.parents[1] / "multi_gpu/prefix_probe_2gpu_h200/Qwen3-8B"
    rows = read_jsonl(run / "traces/tp2/prefix_probes_1x/requests.jsonl")
    body = [line.split(" | ") for line in probe_lines(rows, str(run), "H200", trace, n_gpus=2, config="tp2")[2:]]
    assert all(abs(float(b[4].rstrip("%| "))) < 10 for b in body)
    with pytest.raises(ValueError, match="tp3 runs on 3 GPUs"):
        probe_lines(rows, str(run), "H200", trace, n_gpus=2, config="tp3")
