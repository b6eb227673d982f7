"""Helpers of the GPU tests: servers started through a launcher, greedy requests, facts files.

Model configs come from $SIDP_MODELS_DIR (default ../shared/models beside the repo).

**One-GPU fold** (`SIDP_GPU_FOLD=1`): a server of our launcher asked for GPUs "0,1" runs on GPU 0 with
`--overlay-fold-gpus` (every DP replica's scheduler on gpu_id mod the visible GPUs; the peer transport works unchanged
between processes of one GPU) and `--max-total-tokens FOLD_KV_TOKENS` per replica (SGLang sizes a replica's KV cache
from the memory free when it profiles, so the first replica would otherwise take what the second needs). For
exactness on models that fit twice: the replicas share one GPU's memory and compute, so no speed or capacity number
of a folded run means anything. Tests that can fold are marked `foldable` (see conftest.py).
"""

import json
import os
import time
import urllib.request
from pathlib import Path

from sgl_sidp.bench import exact
from sgl_sidp.bench.server import ServerProcess

MODELS_DIR = Path(os.environ.get("SIDP_MODELS_DIR", Path(__file__).resolve().parents[3] / "shared" / "models"))
FOLD = os.environ.get("SIDP_GPU_FOLD") == "1"
FOLD_KV_TOKENS = 100_000
TOKENIZER = str(__import__("sgl_sidp.launch_server").launch_server.DEFAULT_MODEL_DIR)
COMMON = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--tokenizer-path", TOKENIZER]
PROMPTS = exact.PROMPTS  # 5 to 4,000 tokens (token ids of the bundled 4,096-id tokenizer)


def post(base, payload, timeout=300):
    req = urllib.request.Request(base + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def greedy(base, ids, dp_rank=None, n=16):
    """(output token ids, their logprobs) of a greedy generation, on `dp_rank` if given."""
    ans = exact.parse_answer(post(base, exact.greedy_body(ids, n, dp_rank)))
    if dp_rank is not None:
        assert (ans["dp_rank"] if ans["dp_rank"] is not None else dp_rank) == dp_rank, ans
    return ans["ids"], ans["logprobs"]


class Server(ServerProcess):
    """A server that is only used once SGLang logged "fired up" (its warm-up request done); folds its GPUs onto
    GPU 0 under SIDP_GPU_FOLD=1 (module docstring)."""

    def __init__(self, launcher, args, port, log_path, gpus=None, env=None):
        if FOLD and gpus and "," in gpus:
            assert launcher == "sgl_sidp.launch_server", "only our launcher can fold replicas onto one GPU"
            gpus, args = "0", [*args, "--overlay-fold-gpus", "--max-total-tokens", str(FOLD_KV_TOKENS)]
        super().__init__(launcher, args, port=port, log_path=log_path, gpus=gpus, env=env)

    def __enter__(self):
        self.start()
        try:
            self.wait_ready(timeout_s=240)
        except BaseException:
            self.stop()
            raise
        deadline = time.time() + 120
        while "The server is fired up" not in self.log_text():
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"server never fired up:\n{self.log_tail()}")
            time.sleep(0.5)
        return self


def flush_cache(base):
    """Empty the server's radix cache (SGLang's /flush_cache), so the next prompts are computed in full."""
    with urllib.request.urlopen(urllib.request.Request(base + "/flush_cache", data=b""), timeout=60) as r:
        r.read()


def at_once(base, requests, n=16):
    """Greedy answers (as `greedy`) of `requests`, a list of (prompt, dp_rank or None), all submitted at once."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(requests)) as pool:
        jobs = [pool.submit(greedy, base, p, dp, n) for p, dp in requests]
        return [j.result() for j in jobs]


def vanilla_reference(log_dir, model_dir, name, port, env_var, batched=()):
    """(alone, together) from vanilla SGLang TP1 on `model_dir` (a `make_tiny_models.py --big` checkpoint): `alone`
    the greedy answer to each prompt of PROMPTS sent by itself, `together` the answers to the prompts of indexes
    `batched` sent at once (SGLang batches them: a bf16 GEMM over more rows may round differently). Skips the test
    with how to make the checkpoint when it is missing ($`env_var` points to it)."""
    import pytest

    if not (model_dir / "config.json").is_file():
        pytest.skip(f"{model_dir} missing: python .whl/make_tiny_models.py DIR --big, then {env_var}=DIR/{model_dir.name}")
    with Server("sglang.launch_server", ["--model-path", str(model_dir), *COMMON], port=port,
                log_path=log_dir / f"{name}.log", gpus="0") as srv:
        alone = [greedy(srv.base_url, p) for p in PROMPTS]
        together = at_once(srv.base_url, [(PROMPTS[i], None) for i in batched]) if batched else []
        return alone, together


def answer_diff(ref, got):
    """How greedy answer `got` differs from `ref` (both as `greedy` returns them): `exact.answer_diff`'s tokens equal,
    first differing position and largest |logprob difference| before it."""
    d = exact.answer_diff({"ids": ref[0], "logprobs": ref[1]}, {"ids": got[0], "logprobs": got[1]})
    return {k: d[k] for k in ("tokens_equal", "first_differing_token", "logprob_gap")}


def summary(log_dir, name, **facts):
    (log_dir / f"{name}.facts.json").write_text(json.dumps(facts, indent=1))


def model_args(name):
    """`--model-path` of a config in $SIDP_MODELS_DIR with dummy weights (skips the test if it is missing)."""
    import pytest

    path = MODELS_DIR / name
    if not (path / "config.json").is_file():
        pytest.skip(f"{path} missing: set SIDP_MODELS_DIR")
    return ["--model-path", str(path), "--load-format", "dummy"]


def needs_gpu_memory(gib: float, why: str):
    """Skip the test, saying why, where the first visible GPU has less than `gib` GiB (e.g. a test written for an
    H200's 141 GB on an H100's 80 GB): a skip, not an out-of-memory failure that says nothing of the code."""
    import pytest
    import torch

    have = torch.cuda.get_device_properties(0).total_memory / 2**30
    if have < gib:
        pytest.skip(f"needs a GPU of {gib:.0f} GiB or more ({why}); this one has {have:.0f} GiB")


def child_pid(srv, title, timeout_s=120):
    """The pid of the process titled `title` (e.g. "sglang::scheduler_DP1") among `srv`'s own descendants (another
    server running at the same time has processes of the same titles)."""
    import psutil

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for proc in psutil.Process(srv.proc.pid).children(recursive=True):
            try:
                cmd = " ".join(proc.cmdline()).split()
            except psutil.Error:
                continue
            if cmd and cmd[0] == title:
                return proc.pid
        time.sleep(0.2)
    raise AssertionError(f"no process titled {title} under the server (pid {srv.proc.pid})")
