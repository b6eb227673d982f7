"""The family matrix on one GPU (`pytest -m gpu tests/gpu/test_family_matrix.py`): every (model family, mode) pair the
launch-time checks accept answers bit-identically to vanilla SGLang on a distinct-weight checkpoint.

Families: `scripts/make_family_models.py` (Hugging Face's own classes, a different random tensor in every layer,
biases and norms included), built here. Which modes accept a family comes from the modes' architecture allowlists
(`Feature.architectures`; `tests/test_families.py` checks the refusals on CPU). Modes needing DP ranks run both
replicas folded onto GPU 0 (`--overlay-fold-gpus`, each replica capped at `FOLD_KV_TOKENS`): ZeroDP with `all` and with
the default policy (calibrated at start-up), SiDP WaS, CaS and auto (B_th 64: prefill WaS, decode CaS), Shift's
one-GPU wiring (SP = 1). SGLang's defaults otherwise: decode CUDA graphs and breakable prefill graphs.

Each prompt of `PROMPTS` (5 to 4,000 tokens, 16 greedy tokens) is sent alone, to each DP rank; tokens and logprobs
must equal vanilla TP1's to the last bit. Servers run `SIDP_MATRIX_PARALLEL` at a time (default 6);
`SIDP_FAMILIES=qwen3,llama` limits the families. The results go to $SIDP_GPU_LOGS/family_matrix.json and .md.
"""

import json
import os
import runpy
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servers import COMMON, FOLD_KV_TOKENS, PROMPTS, Server, answer_diff, greedy
from sgl_sidp.features import FEATURES

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]  # the matrix fixture runs every server

MAKER = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts/make_family_models.py"))
ALL = MAKER["FAMILIES"]
SELECTED = [f for f in (os.environ.get("SIDP_FAMILIES") or ",".join(ALL)).split(",") if f]
PARALLEL = int(os.environ.get("SIDP_MATRIX_PARALLEL", "6"))
CAP = ["--max-total-tokens", str(FOLD_KV_TOKENS)]  # every server shares GPU 0 with the others running at once
FOLD = ["--dp-size", "2", "--overlay-fold-gpus", *CAP]

#: mode -> [(case name, flags)]; a family runs a mode's cases when its architecture is in the mode's allowlist
VARIANTS = {
    "zerodp": [("zerodp_all", ["--overlay-mode", "zerodp", "--zerodp-layers", "all", *FOLD]),
               ("zerodp_default", ["--overlay-mode", "zerodp", *FOLD])],
    "sidp": [("sidp_was", ["--overlay-mode", "sidp", "--sidp-service", "was", *FOLD]),
             ("sidp_cas", ["--overlay-mode", "sidp", "--sidp-service", "cas", *FOLD]),
             ("sidp_auto", ["--overlay-mode", "sidp", "--sidp-service", "auto", "--sidp-b-th", "64", *FOLD])],
    "shift": [("shift_sp1", ["--overlay-mode", "shift", *CAP])],
}


def cases_of(family):
    arch = ALL[family][1]
    return [(name, flags) for mode, variants in VARIANTS.items() if arch in FEATURES[mode].architectures
            for name, flags in variants]


def run_case(log_dir, models, family, name, flags, port, calib):
    """Start one server, send every prompt alone to each DP rank; {"answers": {rank: [...]}} or {"error": ...}."""
    ours = name != "vanilla"
    ranks = [0, 1] if "--dp-size" in flags else [None]
    env = {"SIDP_CALIBRATION_DIR": str(calib / f"{family}_{name}")}
    try:
        with Server("sgl_sidp.launch_server" if ours else "sglang.launch_server",
                    ["--model-path", str(models / family), *COMMON, *flags], port=port,
                    log_path=log_dir / f"matrix_{family}_{name}.log", gpus="0", env=env) as srv:
            return {"answers": {str(r): [greedy(srv.base_url, p, dp_rank=r) for p in PROMPTS] for r in ranks}}
    except Exception as e:  # noqa: BLE001 - a failing case is a result of the matrix, reported per case
        log = (log_dir / f"matrix_{family}_{name}.log")
        lines = [ln for ln in (log.read_text(errors="replace").splitlines() if log.exists() else [])
                 if "sgl-sidp" in ln and ("error" in ln.lower() or "failed" in ln or "could not" in ln)]
        return {"error": f"{type(e).__name__}: {str(e)[:300]}", "sgl_sidp_lines": lines[:5],
                "trace": traceback.format_exc()[-1500:]}


def run_all(log_dir, models, calib, jobs):
    """Run `jobs` [(family, name, flags)] PARALLEL at a time; {(family, name): result}."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {(f, n): pool.submit(run_case, log_dir, models, f, n, fl, 24000 + 40 * i, calib)
                   for i, (f, n, fl) in enumerate(jobs)}
        return {k: v.result() for k, v in futures.items()}


def verdict(ref, got):
    """"exact", or why not (a failed server, or the first answer that differs)."""
    if "error" in ref:
        return f"vanilla failed: {ref['error']}"
    if "error" in got:
        return f"failed: {got['error']}"
    for rank, answers in got["answers"].items():
        for i, (a, b) in enumerate(zip(ref["answers"]["None"], answers)):
            d = answer_diff(a, b)
            if not d["tokens_equal"] or d["logprob_gap"] != 0.0:
                return f"differs: DP{rank} prompt {i} ({len(PROMPTS[i])} tokens): {d}"
    return "exact"


@pytest.fixture(scope="module")
def matrix(log_dir, tmp_path_factory):
    models, calib = tmp_path_factory.mktemp("families"), tmp_path_factory.mktemp("calibration")
    for family in SELECTED:
        MAKER["make"](family, models)
    refs = run_all(log_dir, models, calib, [(f, "vanilla", CAP) for f in SELECTED if cases_of(f)])
    results = run_all(log_dir, models, calib, [(f, n, fl) for f in SELECTED for n, fl in cases_of(f)])
    table = {f: {n: verdict(refs[(f, "vanilla")], results[(f, n)]) for n, _ in cases_of(f)} for f in SELECTED}
    (log_dir / "family_matrix.json").write_text(json.dumps(
        {"prompts": [len(p) for p in PROMPTS], "new_tokens": 16, "verdicts": table,
         "errors": {f"{f}/{n}": r for (f, n), r in {**refs, **results}.items() if "error" in r}}, indent=1))
    names = [n for v in VARIANTS.values() for n, _ in v]
    rows = ["| family | architecture | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for f in SELECTED:
        got = table[f]
        rows.append(f"| {f} | {ALL[f][1]} | " + " | ".join(
            ("exact" if got[n] == "exact" else "**" + got[n].split(":")[0] + "**") if n in got else "refused"
            for n in names) + " |")
    (log_dir / "family_matrix.md").write_text("\n".join(rows) + "\n")
    return table


@pytest.mark.parametrize("family, case", [(f, n) for f in SELECTED for n, _ in cases_of(f)])
def test_accepted_family_and_mode_is_bit_identical_to_vanilla(matrix, family, case):
    assert matrix[family][case] == "exact", matrix[family][case]
