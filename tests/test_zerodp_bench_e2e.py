"""scripts/zerodp_compare.py end to end on CPU: two fake SGLang DP servers (this file, run as a module, answers
/health, /generate streamed and not, /server_info, /v1/loads, /metrics and prints SGLang-like log lines), the real
orchestration, replay clients (`python -m sgl_sidp.replay`), reports and log handling. Loopback only."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CAPACITY = {"vanilla": [1000, 1000], "ours": [1000, 3000]}


# ------------------------------------------------------------------------------------------- fake server
def serve(argv: list[str]) -> None:
    """A fake `python -m sglang.launch_server --dp-size 2` (or ours with --overlay-mode zerodp)."""
    from aiohttp import web

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--overlay-mode", default=None)
    p.add_argument("--exit-now", action="store_true", help="fail at start, as a server that cannot load would")
    a, _ = p.parse_known_args(argv)
    if a.exit_now:
        print("RuntimeError: injected start-up failure", flush=True)
        sys.exit(3)
    side = "ours" if a.overlay_mode == "zerodp" else "vanilla"
    caps = CAPACITY[side][: a.dp_size]
    counters = {(r, m): 0 for r in range(a.dp_size) for m in ("decode", "prefill_compute")}
    state = {"next": 0}
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    if side == "ours":
        print(f"sgl-sidp: overlay mode=zerodp (batch signal on); model=m, dp={a.dp_size}", flush=True)
        print(f"[{ts} DP0] sgl-sidp zerodp DP0 TP0: source, serving 2 expert tensors of 1 MoE layers", flush=True)
        for r, c in enumerate(caps):
            role = "source" if r == 0 else "sink"
            print(f"[{ts} DP{r}] sgl-sidp zerodp DP{r} TP0: {role} KV cache {c} tokens (max_total_num_tokens)", flush=True)
    for r, c in enumerate(caps):
        print(f"[{ts} DP{r}] max_total_num_tokens={c}, chunked_prefill_size=8192, context_len=40960", flush=True)

    def route(body) -> int:
        if body.get("routed_dp_rank") is not None:
            return int(body["routed_dp_rank"])
        state["next"] += 1
        # vanilla: round robin; ours: 3 of every 4 requests to the sink (capacity-aware).
        return state["next"] % 2 if side == "vanilla" else int(state["next"] % 4 != 0)

    def output_ids(ids, n):
        return [(sum(ids) + i) % 1000 + 10 for i in range(n)]

    async def generate(request):
        body = await request.json()
        ids, n = body["input_ids"], body["sampling_params"]["max_new_tokens"]
        rank = route(body)
        counters[(rank, "prefill_compute")] += len(ids)
        counters[(rank, "decode")] += n - 1
        out = output_ids(ids, n)
        if not body.get("stream"):
            lps = [[-0.1 * (i + 1), t, None] for i, t in enumerate(out)]
            top = [[[-0.1 * (i + 1), t, None], [-5.0, 3, None]] for i, t in enumerate(out)]
            return web.json_response({"text": "", "output_ids": out, "meta_info": {
                "id": "r", "dp_rank": rank, "completion_tokens": n, "output_token_logprobs": lps,
                "output_top_logprobs": top}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for done in range(1, n + 1):
            await asyncio.sleep(0.002)
            chunk = {"text": "x" * done, "output_ids": out[:done], "meta_info": {
                "id": "r", "dp_rank": rank, "prompt_tokens": len(ids), "completion_tokens": done, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": n} if done == n else None}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(request):
        lines = ["# TYPE sglang:realtime_tokens_total counter"]
        lines += [f'sglang:realtime_tokens_total{{dp_rank="{r}",mode="{m}",tp_rank="0"}} {float(v)}'
                  for (r, m), v in counters.items()]
        return web.Response(text="\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_get("/health", lambda r: web.Response(text="ok"))
    app.router.add_post("/generate", generate)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/loads", lambda r: web.json_response(
        {"loads": [{"dp_rank": i, "max_total_num_tokens": c} for i, c in enumerate(caps)]}))
    app.router.add_get("/server_info", lambda r: web.json_response({
        "max_total_num_tokens": caps[0], "dp_size": a.dp_size, "version": "fake",
        "load_balance_method": "total_tokens" if side == "ours" else "round_robin",
        "internal_states": [{"memory_usage": {"token_capacity": c}} for c in caps]}))
    web.run_app(app, host=a.host, port=a.port, print=None, shutdown_timeout=1)


if __name__ == "__main__":
    serve(sys.argv[1:])
    sys.exit(0)


# ------------------------------------------------------------------------------------------------- tests
import pytest  # noqa: E402

SCRIPT = HERE.parent / "scripts" / "zerodp_compare.py"


@pytest.fixture
def zc(monkeypatch):
    """The script as a module, its servers replaced by this file's fake."""
    spec = importlib.util.spec_from_file_location("zerodp_compare_e2e", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "zerodp_compare_e2e", mod)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "LAUNCHERS", {"vanilla": Path(__file__).stem, "ours": Path(__file__).stem})
    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{HERE.parent}")
    return mod


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_args(tmp_path: Path) -> list[str]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return ["--model-path", str(model), "--vanilla-port", str(_free_port()), "--ours-port", str(_free_port()),
            "--ready-timeout-s", "30", "--no-plot"]


def test_full_run_against_fake_servers(zc, tmp_path, capsys):
    out = tmp_path / "res"
    rc = zc.main(_base_args(tmp_path) + ["--out-dir", str(out), "--exactness", "2", "--decode-heavy", "8",
                                         "--decode-heavy-input-len", "16", "--decode-heavy-output-len", "6"])
    assert rc == 0, (out / "compare.md").read_text()
    rep = json.loads((out / "compare.json").read_text())
    assert rep["status"] == "ok" and rep["planned"] == ["exactness", "decode_heavy"]
    assert rep["servers"]["ours"]["kv_tokens"] == {"0": 1000, "1": 3000}
    assert rep["servers"]["ours"]["capacity_sources"]["zerodp_log"] == {"0": 1000, "1": 3000}
    assert rep["servers"]["vanilla"]["settings"]["load_balance_method"] == "round_robin"
    assert len(rep["servers"]["ours"]["zerodp_lines"]) == 3 and rep["servers"]["vanilla"]["zerodp_lines"] == []
    assert "--overlay-mode zerodp" in rep["servers"]["ours"]["command"]
    assert "--overlay-mode" not in rep["servers"]["vanilla"]["command"]
    pairs = rep["exactness"]["pairs"]
    assert all(p["identical"] == p["prompts"] == 2 and p["max_abs_logprob_diff"] == 0.0 for p in pairs.values())
    assert rep["exactness"]["prompts"][0]["served_by"] == {"ours/DP0": 0, "ours/DP1": 1, "vanilla/DP0": 0}

    wl = rep["workloads"]["decode_heavy"]
    assert wl["status"] == "ok"
    v, o = wl["vanilla"], wl["ours"]
    assert v["per_rank_source"] == o["per_rank_source"] == "meta_info.dp_rank"
    assert v["metrics"]["total_output_tokens"] == o["metrics"]["total_output_tokens"] == 48
    assert [v["ranks"][r]["requests"] for r in "01"] == [4, 4]  # round robin
    assert [o["ranks"][r]["requests"] for r in "01"] == [2, 6]  # the fake's capacity-aware routing
    assert o["ranks"]["1"]["decode_tokens"] == 6 * 5  # Prometheus delta: all tokens after each first
    assert sum(o["ranks"][r]["output_throughput"] for r in "01") == pytest.approx(o["metrics"]["output_throughput"])
    assert wl["ratios"]["DP1 requests"] == pytest.approx(1.5)
    rows = [json.loads(x) for x in (out / "decode_heavy" / "ours" / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["dp_rank"] for r in rows) == [0, 0, 1, 1, 1, 1, 1, 1]

    assert not (out / "server_ours.log").exists()
    assert b"sgl-sidp zerodp DP1 TP0: sink KV cache 3000" in gzip.open(out / "server_ours.log.gz").read()
    md = (out / "compare.md").read_text()
    assert "| DP1 (ours: sink) | 1,000 | 3,000 | 3.000 |" in md and "### decode_heavy" in md
    assert md in capsys.readouterr().out


def test_deadline_skips_steps_but_keeps_servers_report(zc, tmp_path):
    out = tmp_path / "res"
    trace = tmp_path / "az.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n")
    rc = zc.main(_base_args(tmp_path) + ["--out-dir", str(out), "--exactness", "2", "--decode-heavy", "2",
                                         "--azure-code", str(trace), "--deadline-s", "0.01"])
    assert rc == 0
    rep = json.loads((out / "compare.json").read_text())
    assert rep["exactness"]["status"] == "skipped"
    assert {n: w["status"] for n, w in rep["workloads"].items()} == {"decode_heavy": "skipped", "azure_code": "skipped"}
    assert rep["servers"]["vanilla"]["kv_tokens"] == {"0": 1000, "1": 1000}
    assert "Skipped: deadline" in (out / "compare.md").read_text()


def test_server_that_fails_to_start_is_reported_and_the_other_stopped(zc, tmp_path):
    out = tmp_path / "res"
    rc = zc.main(_base_args(tmp_path) + ["--out-dir", str(out), "--exactness", "1", "--decode-heavy", "2",
                                         "--ours-extra=--exit-now"])
    assert rc == 1
    rep = json.loads((out / "compare.json").read_text())
    assert rep["status"] == "failed" and rep["errors"][0].startswith("error: RuntimeError: server exited with 3")
    assert "injected start-up failure" in rep["tracebacks"][0]
    import socket  # the vanilla fake was stopped too: nothing listens on its port any more

    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", rep["servers"]["vanilla"]["port"]), 2):
        pass
    md = (out / "compare.md").read_text()
    assert "### decode_heavy" in md and "Not run" in md and (out / "server_ours.log.gz").exists()
