"""`python -m sgl_sidp.launch_server` serves real clients on a GPU (run with `pytest -m gpu`).

One server per case, started once and checked many ways: SGLang's native /generate
(plain and streaming), the OpenAI API through the `openai` client, a program written
with SGLang's frontend language (`sgl.function` + `RuntimeEndpoint`), the plugin's
per-scheduler log line, and its Prometheus metrics.
"""

import json
import os
import re
import urllib.request
from pathlib import Path

import pytest

from sgl_sidp.bench.server import ServerProcess

pytestmark = pytest.mark.gpu

MODELS_DIR = Path(os.environ.get("SIDP_MODELS_DIR", Path(__file__).resolve().parents[3] / "shared" / "models"))

COMMON = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--enable-metrics",
          "--overlay-batch-signal", "--overlay-signal-log-interval", "5"]
TOKENIZER = ["--tokenizer-path", str(__import__("sgl_sidp.launch_server").launch_server.DEFAULT_MODEL_DIR)]
CASES = {
    "default": [],
    "qwen3_30b_a3b": ["--model-path", str(MODELS_DIR / "Qwen3-30B-A3B"), "--load-format", "dummy", *TOKENIZER],
}


def post(base, path, payload, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module", params=list(CASES))
def server(request, log_dir):
    if request.param != "default" and not (MODELS_DIR / "Qwen3-30B-A3B" / "config.json").is_file():
        pytest.skip(f"{MODELS_DIR}/Qwen3-30B-A3B/config.json not found (set SIDP_MODELS_DIR)")
    srv = ServerProcess("sgl_sidp.launch_server", CASES[request.param] + COMMON, port=21000,
                        log_path=log_dir / f"server_{request.param}.log", gpus="0")
    with srv:
        yield srv


def test_generate_native(server):
    out = post(server.base_url, "/generate", {"text": "def fib(n):", "sampling_params": {"max_new_tokens": 16, "temperature": 0}})
    assert out["meta_info"]["completion_tokens"] >= 1
    ids = list(range(10, 266))
    out = post(server.base_url, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 32, "ignore_eos": True}})
    assert out["meta_info"]["prompt_tokens"] == 256 and out["meta_info"]["completion_tokens"] == 32
    again = post(server.base_url, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
    assert again["meta_info"]["cached_tokens"] > 0  # the radix cache saw the same prompt


def test_generate_streaming(server):
    req = urllib.request.Request(server.base_url + "/generate", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"input_ids": list(range(20, 120)), "stream": True,
                                                  "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}).encode())
    chunks = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                chunks.append(json.loads(line[5:]))
    assert len(chunks) >= 2 and chunks[-1]["meta_info"]["completion_tokens"] == 24


def test_openai_client(server):
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello!"}],
                                          max_tokens=16, temperature=0)
    assert chat.choices[0].message is not None and chat.usage.completion_tokens >= 1
    comp = client.completions.create(model=model, prompt="import os\n", max_tokens=8, temperature=0)
    assert comp.usage.completion_tokens >= 1
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count."}],
                                            max_tokens=8, stream=True)
    assert sum(1 for _ in stream) >= 1


def test_sglang_frontend_program(server):
    import sglang as sgl

    @sgl.function
    def complete(s, prefix):
        s += prefix
        s += sgl.gen("body", max_tokens=12, temperature=0)

    backend = sgl.RuntimeEndpoint(server.base_url)
    state = complete.run(prefix="class Stack:\n", backend=backend)
    assert isinstance(state["body"], str)
    states = complete.run_batch([{"prefix": "import sys\n"}, {"prefix": "def main():\n"}], backend=backend)
    assert all(isinstance(s["body"], str) for s in states)


def test_plugin_log_and_metrics(server):
    # enough busy iterations for a batch-signal log line (interval 5)
    post(server.base_url, "/generate", {"input_ids": [list(range(30, 90))] * 4,
                                        "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}})
    log = server.log_text()
    assert re.search(r"sgl-sidp: overlay mode=off \(batch signal on\)", log)
    assert "sgl-sidp plugin active in scheduler DP0 TP0" in log
    assert "sgl-sidp batch signal [DP0 TP0] over 5 iters" in log
    metrics = server.get("/metrics")
    computed = [l for l in metrics.splitlines() if l.startswith("sglang:sidp_computed_tokens_total{")]
    assert computed and float(computed[0].rsplit(" ", 1)[1]) > 0


@pytest.mark.gpus(2)
def test_dp2_plugin_in_both_schedulers(log_dir):
    srv = ServerProcess("sgl_sidp.launch_server", ["--dp-size", "2", *COMMON], port=21100,
                        log_path=log_dir / "server_default_dp2.log", gpus="0,1")
    with srv:
        for _ in range(4):  # SGLang's round-robin DP router: both ranks get requests
            post(srv.base_url, "/generate", {"input_ids": [list(range(40, 100))] * 4,
                                             "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}})
        log, metrics = srv.log_text(), srv.get("/metrics")
    for dp in (0, 1):
        assert f"sgl-sidp plugin active in scheduler DP{dp} TP0" in log
        assert f"sgl-sidp batch signal [DP{dp} TP0]" in log
        assert re.search(rf'sglang:sidp_computed_tokens_total{{[^}}]*dp_rank="{dp}"[^}}]*}} [1-9]', metrics)
