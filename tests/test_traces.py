"""Trace loaders, replay-window arithmetic and Mooncake prefix reconstruction (sgl_sidp.bench.traces)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sgl_sidp.bench.traces import (
    MOONCAKE_BLOCK_TOKENS,
    PromptBuilder,
    TraceRequest,
    detect_format,
    file_sha256,
    fitted_prompt_len,
    load_trace,
    plan_replay,
    schedule_offsets,
    select_window,
)

REPO = Path(__file__).resolve().parents[1]
TRACES_DIR = Path(os.environ.get("SIDP_TRACES_DIR", Path(__file__).resolve().parents[2] / "shared" / "traces"))
AZURE_CODE = TRACES_DIR / "AzureLLMInferenceTrace_code.csv"
MOONCAKE_CONV = TRACES_DIR / "conversation_trace.jsonl"
B = MOONCAKE_BLOCK_TOKENS


def real_trace(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"real trace {path.name} not found in {TRACES_DIR} (set SIDP_TRACES_DIR)")
    return path


def published_sha256(name: str) -> str:
    for line in (TRACES_DIR / "SHA256SUMS").read_text().splitlines():
        digest, _, file = line.partition("  ")
        if file.strip() == name:
            return digest
    raise AssertionError(f"{name} not in SHA256SUMS")


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    return write_lines(path, [json.dumps(r) for r in rows])


# --- real traces ---------------------------------------------------------------------------------------------


def test_azure_code_trace_real():
    path = real_trace(AZURE_CODE)
    assert detect_format(path) == "azure"
    reqs = load_trace(path)
    assert len(reqs) == 8819
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert arrivals[-1] == pytest.approx(3435.948056, abs=1e-6)  # 57.3 min, 7th fractional digit dropped
    assert (min(r.input_len for r in reqs), max(r.input_len for r in reqs)) == (3, 7437)
    assert (min(r.output_len for r in reqs), max(r.output_len for r in reqs)) == (6, 1899)
    assert all(r.hash_ids is None for r in reqs)
    assert file_sha256(path) == published_sha256(path.name)


def test_mooncake_conversation_trace_real():
    path = real_trace(MOONCAKE_CONV)
    assert detect_format(path) == "mooncake"
    reqs = load_trace(path)
    assert len(reqs) == 12031
    assert reqs[-1].arrival_s == pytest.approx(3536.999)
    # Every row's prompt fits its blocks: the last block holds 1..512 tokens.
    assert all(0 < r.input_len - B * (len(r.hash_ids) - 1) <= B for r in reqs)
    # hash_ids name prefixes, so the best possible prefix-cache hit rate follows from them (README: 37.4 %).
    seen: set[int] = set()
    hit = total = 0
    for r in reqs:
        shared = next((i for i, h in enumerate(r.hash_ids) if h not in seen), len(r.hash_ids))
        hit += min(B * shared, r.input_len)
        total += r.input_len
        seen.update(r.hash_ids)
    assert hit / total == pytest.approx(0.374, abs=5e-4)


def test_mooncake_real_prompts_share_exactly_their_blocks():
    reqs = load_trace(real_trace(MOONCAKE_CONV))[:120]
    builder = PromptBuilder(seed=0)
    prompts = [builder.build(r) for r in reqs]
    assert [len(p) for p in prompts] == [r.input_len for r in reqs]
    pairs_sharing = 0
    for (a, pa), (b, pb) in itertools.combinations(zip(reqs, prompts), 2):
        n_full = min(len(pa), len(pb)) // B
        for j in range(n_full):
            same_id = j < min(len(a.hash_ids), len(b.hash_ids)) and a.hash_ids[j] == b.hash_ids[j]
            assert np.array_equal(pa[j * B : (j + 1) * B], pb[j * B : (j + 1) * B]) == same_id
        pairs_sharing += a.hash_ids[0] == b.hash_ids[0]
    assert pairs_sharing > 100  # the sample does exercise shared prefixes


# --- loaders and format detection on small fixtures -----------------------------------------------------------


def test_azure_csv_fixture(tmp_path):
    path = write_lines(
        tmp_path / "azure_conv.csv",
        [
            "TIMESTAMP,ContextTokens,GeneratedTokens",
            "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:50.9951690,396,109",
            "2023-11-16 18:15:46.0000009,10,5",  # out of order; 7th digit below a microsecond
            "2023-11-16 18:16:46,20,7",  # no fraction
        ],
    )
    assert detect_format(path) == "azure"
    reqs = load_trace(path)
    assert [r.index for r in reqs] == [2, 0, 1, 3]
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.68059, 4.995169, 60.0])
    assert (reqs[1].input_len, reqs[1].output_len) == (374, 44)


def test_jsonl_fixtures_and_format_override(tmp_path):
    rows = [
        {"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 100, "output_length": 9, "hash_ids": [0]},
    ]
    mooncake = write_jsonl(tmp_path / "m.jsonl", rows)
    shift = write_jsonl(tmp_path / "s.jsonl", [{k: v for k, v in r.items() if k != "hash_ids"} for r in rows])
    assert detect_format(mooncake) == "mooncake" and detect_format(shift) == "shift"
    m = load_trace(mooncake)
    assert [(r.index, r.arrival_s, r.input_len, r.output_len, r.hash_ids) for r in m] == [
        (1, 0.0, 100, 9, (0,)),
        (0, 1.0, 600, 3, (0, 1)),
    ]
    assert all(r.hash_ids is None for r in load_trace(shift))
    assert all(r.hash_ids is None for r in load_trace(mooncake, fmt="shift"))  # explicit override wins


def test_bad_trace_files(tmp_path):
    with pytest.raises(ValueError):
        detect_format(write_lines(tmp_path / "x.txt", ["hello"]))
    with pytest.raises(ValueError):
        detect_format(write_jsonl(tmp_path / "y.jsonl", [{"ts": 1}]))
    with pytest.raises(ValueError):
        load_trace(write_jsonl(tmp_path / "z.jsonl", [{"timestamp": 0, "input_length": 1, "output_length": 1}]), "foo")
    with pytest.raises(ValueError, match="not a valid mooncake trace"):
        load_trace(
            write_jsonl(tmp_path / "w.jsonl", [{"timestamp": 0, "input_length": 1, "output_length": 1}]), "mooncake"
        )


# --- window, time scale, gap compression, max requests, context limit ----------------------------------------


def reqs_at(arrivals, input_len=100, output_len=10):
    return [TraceRequest(i, t, input_len, output_len) for i, t in enumerate(arrivals)]


def test_select_window_is_half_open():
    reqs = reqs_at([0.0, 1.0, 2.0, 2.5, 3.0, 10.0])
    assert [r.index for r in select_window(reqs, 1.0, 2.0)] == [1, 2, 3]
    assert [r.index for r in select_window(reqs, 2.5)] == [3, 4, 5]
    assert select_window(reqs, 11.0) == []


def test_schedule_offsets_scale_and_gap_compression():
    arrivals = [5.0, 5.5, 6.0, 106.0, 106.25, 406.25]
    assert schedule_offsets(arrivals) == pytest.approx([0, 0.5, 1.0, 101.0, 101.25, 401.25])
    assert schedule_offsets(arrivals, time_scale=2.0) == pytest.approx([0, 1.0, 2.0, 202.0, 202.5, 802.5])
    # gaps over 10 s (trace time) become 10 s, then scaling applies
    assert schedule_offsets(arrivals, compress_gaps_s=10) == pytest.approx([0, 0.5, 1.0, 11.0, 11.25, 21.25])
    assert schedule_offsets(arrivals, 0.5, compress_gaps_s=10) == pytest.approx([0, 0.25, 0.5, 5.5, 5.625, 10.625])
    assert schedule_offsets([]).size == 0
    with pytest.raises(ValueError):
        schedule_offsets(arrivals, time_scale=0)
    with pytest.raises(ValueError):
        schedule_offsets([2.0, 1.0])


def test_fitted_prompt_len():
    r = TraceRequest(0, 0.0, 1000, 100)
    assert fitted_prompt_len(r, None) == 1000
    assert fitted_prompt_len(r, 1100) == 1000
    assert fitted_prompt_len(r, 1099) is None
    assert fitted_prompt_len(r, 1099, "truncate") == 999
    assert fitted_prompt_len(r, 100, "truncate") is None  # no prompt token would be left
    with pytest.raises(ValueError):
        fitted_prompt_len(r, 10, "drop")


def test_plan_replay_arithmetic():
    reqs = reqs_at([0, 1, 2, 3, 50, 51, 52, 53])
    reqs[5] = TraceRequest(5, 51, 5000, 10)  # over a 4096 context
    plan = plan_replay(reqs, start_s=1, duration_s=60, max_context_len=4096, compress_gaps_s=5, time_scale=2)
    assert [i.request.index for i in plan.items] == [1, 2, 3, 4, 6, 7]
    assert [i.offset_s for i in plan.items] == pytest.approx([0, 2, 4, 14, 18, 20])
    assert (plan.in_window, plan.skipped_context, plan.truncated_context) == (7, 1, 0)
    # max_requests counts requests sent; the skip count covers the rows looked at
    plan = plan_replay(reqs, start_s=1, max_requests=4, max_context_len=4096)
    assert [i.request.index for i in plan.items] == [1, 2, 3, 4]
    assert plan.skipped_context == 0
    plan = plan_replay(reqs, max_context_len=4096, context_overflow="truncate")
    assert [i.prompt_len for i in plan.items] == [100] * 5 + [4086] + [100] * 2
    assert plan.truncated_context == 1


# --- prompt reconstruction -----------------------------------------------------------------------------------


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if diff.size else n


MOONCAKE_FIXTURE = [
    TraceRequest(0, 0.0, 3 * B, 5, (7, 8, 9)),
    TraceRequest(1, 0.0, 2 * B + 100, 5, (7, 8, 10)),  # shares 2 blocks with 0, last block partial
    TraceRequest(2, 0.0, B + 1, 5, (7, 11)),  # shares 1 block
    TraceRequest(3, 0.0, 300, 5, (12,)),  # shares nothing
    TraceRequest(4, 0.0, 2 * B + 40, 5, (7, 8, 9)),  # partial copy of 0's last block
]


def test_mooncake_prompts_share_exactly_the_shared_blocks():
    builder = PromptBuilder(seed=0)
    p = [builder.build(r) for r in MOONCAKE_FIXTURE]
    assert [len(x) for x in p] == [r.input_len for r in MOONCAKE_FIXTURE]
    assert common_prefix_len(p[0], p[1]) == 2 * B  # and the token after the shared prefix differs
    assert common_prefix_len(p[0], p[2]) == B
    assert common_prefix_len(p[1], p[2]) == B
    assert common_prefix_len(p[0], p[3]) == 0
    assert common_prefix_len(p[0], p[4]) == len(p[4])  # same ids: the partial last block is a prefix of the full one
    assert all(x.dtype == np.int32 and x.min() >= 10 and x.max() < 4000 for x in p)
    assert builder.block.cache_info().hits > 0  # blocks are memoized


def test_random_prompts_seeded_per_request():
    reqs = reqs_at([0.0, 0.0], input_len=700)
    a = PromptBuilder(seed=0, token_id_range=(50, 60))
    p0, p1 = a.build(reqs[0]), a.build(reqs[1])
    assert len(p0) == 700 and p0.min() >= 50 and p0.max() < 60
    assert not np.array_equal(p0, p1)
    assert np.array_equal(p0, PromptBuilder(seed=0, token_id_range=(50, 60)).build(reqs[0]))
    assert not np.array_equal(p0, PromptBuilder(seed=1, token_id_range=(50, 60)).build(reqs[0]))
    with pytest.raises(ValueError):
        PromptBuilder(token_id_range=(10, 10))
    with pytest.raises(ValueError):
        PromptBuilder().build(TraceRequest(0, 0.0, B + 1, 1, (1,)))  # input_length does not fit its blocks


_DIGEST_SNIPPET = """
import hashlib, sys
from sgl_sidp.bench.traces import PromptBuilder, TraceRequest
reqs = [TraceRequest(0, 0.0, 1200, 5, (3, 141592, 2**40)), TraceRequest(9, 0.0, 333, 5, None)]
b = PromptBuilder(seed=int(sys.argv[1]))
print(hashlib.sha256(b"".join(b.build(r).tobytes() for r in reqs)).hexdigest())
"""


def test_prompts_are_stable_across_processes():
    reqs = [TraceRequest(0, 0.0, 1200, 5, (3, 141592, 2**40)), TraceRequest(9, 0.0, 333, 5, None)]
    b = PromptBuilder(seed=42)
    here = hashlib.sha256(b"".join(b.build(r).tobytes() for r in reqs)).hexdigest()
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    there = subprocess.run(
        [sys.executable, "-c", _DIGEST_SNIPPET, "42"], capture_output=True, text=True, check=True, env=env, cwd=REPO
    ).stdout.strip()
    assert there == here


# --- manifest and scripts/fetch_traces.py ---------------------------------------------------------------------


def manifest() -> dict:
    return json.loads((REPO / "bench_traces" / "manifest.json").read_text())


def test_manifest_matches_the_real_traces():
    entries = {e["file"]: e for e in manifest()["traces"]}
    assert {"AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv", "conversation_trace.jsonl"} <= set(
        entries
    )
    for path in (real_trace(AZURE_CODE), real_trace(MOONCAKE_CONV)):
        e = entries[path.name]
        assert e["sha256"] == published_sha256(path.name)
        reqs = load_trace(path, e["format"])
        assert e["rows"] == len(reqs)
        assert e["span_s"] == pytest.approx(reqs[-1].arrival_s, abs=1e-3)
        assert e["url"].startswith("https://raw.githubusercontent.com/") and e["url"].endswith(path.name)


def run_fetch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "fetch_traces.py"), *args], capture_output=True, text=True
    )


def test_fetch_traces_copies_and_verifies(tmp_path):
    real_trace(AZURE_CODE)
    dest = tmp_path / "data"
    res = run_fetch("--from", str(TRACES_DIR), "--dest", str(dest))
    assert res.returncode == 0, res.stderr
    assert file_sha256(dest / AZURE_CODE.name) == published_sha256(AZURE_CODE.name)
    assert "azure_conv_2023: skipped" in res.stdout  # not in the shared folder
    assert "already at" in run_fetch("--from", str(TRACES_DIR), "--dest", str(dest), "--only", "azure_code_2023").stdout

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / AZURE_CODE.name).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    res = run_fetch("--from", str(bad), "--dest", str(tmp_path / "d2"), "--only", "azure_code_2023")
    assert res.returncode == 1 and "checksum" in res.stderr
    assert not (tmp_path / "d2" / AZURE_CODE.name).exists()


def test_prefix_probe_trace_shares_exactly_the_cached_blocks(tmp_path):
    from sgl_sidp.bench.traces import PREFIX_PROBE_PAIRS, prefix_probe_rows

    path = tmp_path / "probes.jsonl"
    subprocess.run([sys.executable, "-m", "sgl_sidp.bench.traces", "prefix-probes", str(path)], check=True)
    reqs = load_trace(path)
    per_base = 1 + len(PREFIX_PROBE_PAIRS)
    assert len(reqs) == 2 * per_base
    seen: set[int] = set()
    for b in range(2):
        base, probes = reqs[b * per_base], reqs[b * per_base + 1:(b + 1) * per_base]
        assert base.input_len == 24576 and not seen & set(base.hash_ids)
        seen |= set(base.hash_ids)
        for (new, cached), r in zip(PREFIX_PROBE_PAIRS, probes):
            assert r.input_len == new + cached and len(r.hash_ids) * 512 == r.input_len
            assert r.hash_ids[:cached // 512] == base.hash_ids[:cached // 512]
            assert not seen & set(r.hash_ids[cached // 512:])  # the new blocks: no other request has them
            seen |= set(r.hash_ids)
        gaps = np.diff([r.arrival_s for r in reqs[b * per_base:(b + 1) * per_base]])
        assert gaps[0] == 8.0 and set(gaps[1:]) == {6.0}
    with pytest.raises(ValueError, match="multiples of 512"):
        prefix_probe_rows(pairs=((1000, 8192),))
