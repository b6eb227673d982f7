"""The SGLang flags the planner models (`plan.server_flags.ServerFlags`): read off a command line or SGLang's parsed
flags, and what each changes in a plan (the prefill chunk and budget, the KV pool's memory fraction, the largest
decode graph), in the CLI, `--overlay-mode auto` and an explicit mode's start-up line."""

import argparse
from pathlib import Path

import pytest

from sgl_sidp.calibration.memory import default_mem_fraction_static, prefill_graph_bucket_count
from sgl_sidp.plan.server_flags import DEFAULTS, ServerFlags, ServerFlagsError, only_server_flags

DENSE = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-8B"
needs_models = pytest.mark.skipif(not DENSE.is_dir(), reason=f"{DENSE} not found (the shared model configs)")


def test_flags_are_read_off_a_command_line_as_argparse_would():
    words = ["python", "-m", "sglang.launch_server", "--chunked-prefill-size", "4096", "--mem-fraction-static=0.8",
             "--cuda-graph-max-bs", "512", "--max-prefill-tokens", "8192", "--tp", "2"]
    f = ServerFlags.from_words(words)
    assert f == ServerFlags(chunked_prefill_size=4096, max_prefill_tokens=8192, mem_fraction_static=0.8,
                            decode_graph_max_bs=512)
    assert ServerFlags.from_words(f.words()) == f  # the words say the same again
    assert f.describe() == ("--chunked-prefill-size 4096 --max-prefill-tokens 8192 --mem-fraction-static 0.8 "
                            "--cuda-graph-max-bs-decode 512")
    # the last of a repeated flag wins; SGLang's new spelling; graphs off whatever the largest batch says
    assert ServerFlags.from_words(["--chunked-prefill-size", "1", "--chunked-prefill-size=2048"]).chunked_prefill_size == 2048
    assert ServerFlags.from_words(["--cuda-graph-max-bs-decode", "384"]).decode_graph_max_bs == 384
    off = ServerFlags.from_words(["--disable-cuda-graph", "--cuda-graph-max-bs", "512"])
    assert (off.decode_graph_limit(256), off.prefill_graphs) == (0, False)
    assert off.words() == ["--cuda-graph-max-bs-decode", "512", "--disable-cuda-graph"]  # as given
    decode_off = ServerFlags.from_words(["--disable-decode-cuda-graph"])
    assert (decode_off.decode_graphs, decode_off.prefill_graphs, decode_off.words()) == (False, True, [
        "--disable-decode-cuda-graph"])
    backend = ServerFlags.from_words(["--cuda-graph-backend-prefill", "disabled", "--cuda-graph-backend-decode=full"])
    assert (backend.decode_graphs, backend.prefill_graphs) == (True, False)  # another backend: planned as the default
    assert ServerFlags(decode_graph_max_bs=384).decode_graph_limit(256) == 384 and DEFAULTS.decode_graph_limit(256) == 256
    assert ServerFlags.from_words(["--tp", "2", "--enable-mixed-chunk"]) == DEFAULTS and DEFAULTS.describe() == ""
    assert only_server_flags(["--chunked-prefill-size", "4096", "--disable-cuda-graph", "--mem-fraction-static=0.8"])
    assert not only_server_flags(["--chunked-prefill-size"]) and not only_server_flags(["--enable-mixed-chunk"])


@pytest.mark.parametrize("words, why", [
    (["--chunked-prefill-size", "-1"], "simulates chunked prefill only"),
    (["--chunked-prefill-size", "big"], "expected a number"),
    (["--mem-fraction-static", "1.2"], "between 0 and 1"),
    (["--max-prefill-tokens", "0"], "at least 1"),
    (["--cuda-graph-max-bs"], "expected a number"),  # no value left
])
def test_a_value_the_planner_cannot_use_is_one_line(words, why):
    with pytest.raises(ServerFlagsError, match=why):
        ServerFlags.from_words(words)


def test_sglangs_parsed_flags_give_the_same_flags():
    from sglang.srt.server_args import ServerArgs

    ap = argparse.ArgumentParser()
    ServerArgs.add_cli_args(ap)
    assert ServerFlags.from_namespace(ap.parse_args(["--model-path", "m"])) == DEFAULTS  # SGLang's defaults: unset
    ns = ap.parse_args(["--model-path", "m", "--cuda-graph-max-bs", "512", "--chunked-prefill-size", "4096",
                        "--mem-fraction-static", "0.85"])
    assert ServerFlags.from_namespace(ns) == ServerFlags(chunked_prefill_size=4096, mem_fraction_static=0.85,
                                                         decode_graph_max_bs=512)
    off = ServerFlags.from_namespace(ap.parse_args(["--model-path", "m", "--disable-cuda-graph"]))
    assert (off.decode_graphs, off.prefill_graphs) == (False, False)
    off = ServerFlags.from_namespace(ap.parse_args(["--model-path", "m", "--disable-decode-cuda-graph"]))
    assert (off.decode_graphs, off.prefill_graphs) == (False, True)


def test_sglangs_memory_default_follows_the_chunk_and_the_graphs():
    """`default_mem_fraction_static` as SGLang 0.5.17's `reserve_for_graph_mb`: 8 MiB per prefill graph, one per
    captured token count up to the chunk (`_generate_prefill_cuda_graph_batch_sizes`), 2 MiB per decode graph size."""
    assert [prefill_graph_bucket_count(t) for t in (2048, 4096, 8192, 16384)] == [42, 50, 58, 74]
    at = default_mem_fraction_static(81_559)  # H100: 8,192-token chunk, 58 prefill graphs, 256 decode sizes
    assert default_mem_fraction_static(81_559, prefill_graph_buckets=58) == at
    assert default_mem_fraction_static(81_559, chunked_prefill=16384) == round(
        (81_559 - (512 + 16384 * 1.5 + 1024 / 8 + 256 * 2 + 74 * 8)) / 81_559, 3)
    assert default_mem_fraction_static(81_559, decode_graphs=False) == round(
        (81_559 - (512 + 8192 * 1.5 + 1024 / 8 + 58 * 8)) / 81_559, 3)


def test_replica_limits_take_the_chunk_and_budget_dp_attention_dividing_the_chunk():
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import replica_limits

    f = ServerFlags(chunked_prefill_size=4096, max_prefill_tokens=8192)
    assert (replica_limits(configuration_named("tp2"), 10, f).chunked_prefill,
            replica_limits(configuration_named("tp2"), 10, f).max_prefill_tokens) == (4096, 8192)
    assert replica_limits(configuration_named("dp2_attn"), 10, f).chunked_prefill == 2048
    assert replica_limits(configuration_named("dp2_attn"), 10).chunked_prefill == 4096  # SGLang's 8,192 / 2
    assert replica_limits(configuration_named("tp2"), 10).max_prefill_tokens == 16384


@needs_models
def test_each_flag_moves_the_plan_as_sglang_would():
    from sgl_sidp.plan.planner import plan, table

    def rows(**flags):
        result = plan(str(DENSE), 2, "H200", "offline:64:2048:64", server=ServerFlags(**flags),
                      names=["shift_sp2_tp1_nccl"])
        return result, {r.name: r for r in result["configurations"]}

    base, at = rows()
    # SGLang's default memory fraction reserves 1.5 MiB per chunk token: a smaller chunk leaves more KV
    _, small = rows(chunked_prefill_size=2048)
    assert small["tp2"].kv_tokens_total > at["tp2"].kv_tokens_total
    assert small["tp2"].ttft_ms_p50 != at["tp2"].ttft_ms_p50  # 2,048-token prefill forwards, not 8,192
    # Shift's exchange buffer holds two slots of a chunk's QKV blocks: a quarter of the chunk frees 3/4 of its 101 MB,
    # about 1,000 KV tokens more than Shift by NCCL (no buffer) gains from the same memory fraction
    freed = ((small["shift_sp2_tp1"].kv_tokens_total - at["shift_sp2_tp1"].kv_tokens_total)
             - (small["shift_sp2_tp1_nccl"].kv_tokens_total - at["shift_sp2_tp1_nccl"].kv_tokens_total))
    assert 500 < freed < 1500, freed
    fixed, lower = rows(mem_fraction_static=0.8)
    assert lower["tp2"].kv_tokens_total < at["tp2"].kv_tokens_total and lower["tp2"].mem_fraction_static == 0.8
    # more decode graphs reserve more memory (2 MiB a captured batch size); none at all prices every step eagerly
    _, graphs = rows(decode_graph_max_bs=512)
    assert graphs["dp2"].kv_tokens_total < at["dp2"].kv_tokens_total
    _, eager = rows(decode_graphs=False)
    assert eager["dp2"].decode_step_ms["256"]["8"] > at["dp2"].decode_step_ms["256"]["8"]
    assert eager["dp2"].kv_tokens_total > at["dp2"].kv_tokens_total  # no decode graphs reserved
    # DP attention's padding reserve stays sized by SGLang's largest decode graph with the graphs off
    # (`ServerArgs.reserve_for_graph_mb`); no prefill graphs, no prefill graphs' reserve
    _, none = rows(decode_graphs=False, prefill_graphs=False)
    assert none["dp2_attn"].mem_fraction_static == pytest.approx(
        default_mem_fraction_static(143_771, 2, decode_graphs=False, prefill_graph_buckets=0, dp_attention_dp=2))
    assert base["server_flags"] == "" and fixed["server_flags"] == "--mem-fraction-static 0.8"
    text = table(fixed)
    assert "SGLang flags --mem-fraction-static 0.8 (every number below is a prediction)" in text
    assert text.split("Launch: ")[1].split("\n")[0].endswith(" --mem-fraction-static 0.8")


@needs_models
def test_the_cli_auto_and_an_explicit_mode_plan_with_the_users_flags(monkeypatch, capsys):
    import types

    from sgl_sidp import launch_server as ls
    from sgl_sidp.config import SidpConfig, SidpConfigError
    from sgl_sidp.plan import __main__ as cli
    from sgl_sidp.plan import planner

    cli.main(["--model-path", str(DENSE), "--gpus", "2", "--workload", "offline:64:2048:64", "--cuda-graph-max-bs", "512"])
    assert "SGLang flags --cuda-graph-max-bs-decode 512" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--model-path", str(DENSE), "--gpus", "2", "--chunked-prefill-size", "-1"])
    assert capsys.readouterr().err.strip() == ("sgl-sidp plan: error: --chunked-prefill-size -1: the planner "
                                               "simulates chunked prefill only (a chunk of at least 1 token)")
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: 2)
    seen = []
    real = planner.plan
    monkeypatch.setattr(planner, "plan", lambda *a, **k: seen.append(k.get("server")) or real(*a, **k))
    argv = ["--model-path", str(DENSE), "--overlay-mode", "auto", "--chunked-prefill-size", "4096"]
    chosen = ls.resolve_auto(argv)
    assert seen[-1] == ServerFlags(chunked_prefill_size=4096) and chosen.count("--chunked-prefill-size") == 1
    with pytest.raises(SidpConfigError, match="--overlay-mode auto: --chunked-prefill-size -1: the planner simulates"):
        ls.resolve_auto(argv[:-1] + ["-1"])
    cfg = SidpConfig.from_cli_args(ls.split_args(["--overlay-mode", "shift"])[0])
    server_args = types.SimpleNamespace(model_path=str(DENSE), dp_size=1, tp_size=2, base_gpu_id=0)
    raw = ls.sglang_raw_args(["--model-path", str(DENSE), "--tp-size", "2", "--mem-fraction-static", "0.8"])
    line = ls.mode_verdict(cfg, server_args, raw)
    assert line.startswith("sgl-sidp: --overlay-mode shift (shift_sp2_tp1)") and "no prediction" not in line
    assert seen[-1] == ServerFlags(mem_fraction_static=0.8)


@needs_models
def test_shift_raises_sglangs_decode_graphs_unless_the_user_sets_them():
    """Shift's SGLang default (`shift.feature.sglang_defaults`): decode graphs up to 512 rows, its decodes below the
    threshold being TP at those batches (q8_graphs512_shift_2gpu_h200: 1.80x on 512 x (1,024, 256)); the planner
    prices Shift's server so (`Technique.decode_graph_max_bs`) and the user's flags win."""
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import plan
    from sgl_sidp.shift.feature import DECODE_GRAPH_MAX_BS, sglang_defaults

    assert sglang_defaults(["--tp-size", "2"]) == ["--tp-size", "2", "--cuda-graph-max-bs-decode", "512"]
    for given in (["--cuda-graph-max-bs", "128"], ["--disable-cuda-graph"], ["--cuda-graph-max-bs-decode=64"],
                  ["--cuda-graph-backend-decode", "disabled"]):
        assert sglang_defaults(given) == given
    shift, tp2 = configuration_named("shift_sp2_tp1"), configuration_named("tp2")
    assert (shift.kind.decode_graph_max_bs(shift, 256), tp2.kind.decode_graph_max_bs(tp2, 256)) == (DECODE_GRAPH_MAX_BS, 256)
    assert shift.kind.decode_graph_max_bs(shift, 1024) == 1024

    def kv(**flags):
        return {r.name: r.kv_tokens_total
                for r in plan(str(DENSE), 2, "H200", "latency:2048:4", server=ServerFlags(**flags))["configurations"]}

    default, at_256 = kv(), kv(decode_graph_max_bs=256)
    # 256 more captured sizes at 2 MiB each: 512 MiB less KV pool (measured 1,600,829 -> 1,594,791 tokens, -0.38 %)
    assert at_256["shift_sp2_tp1"] - default["shift_sp2_tp1"] == pytest.approx(1_600_829 - 1_594_791, rel=0.02)
    assert at_256["tp2"] == default["tp2"]


def test_a_servers_captured_decode_graphs_are_read_off_its_log(tmp_path):
    """`compare_report.server_flags_of`: where the command sets no largest decode graph, the server's log says what
    it captured (a feature's own default is not in the command: Shift's servers before it raised the limit)."""
    import gzip

    from sgl_sidp.bench.compare_report import server_flags_of

    (tmp_path / "logs").mkdir()
    with gzip.open(tmp_path / "logs" / "shift_sp2_tp1.log.gz", "wt") as f:
        f.write("[TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 248, 256], "
                "avail mem=10.35 GB\n")
    result = {"config": "shift_sp2_tp1", "command": "python -m sgl_sidp.launch_server --tp-size 2 --overlay-mode shift"}
    assert server_flags_of(result, tmp_path) == ServerFlags(decode_graph_max_bs=256)
    assert server_flags_of(result) == DEFAULTS  # no folder: the command alone
    given = {**result, "command": result["command"] + " --cuda-graph-max-bs-decode 384"}
    assert server_flags_of(given, tmp_path).decode_graph_max_bs == 384  # the command wins
