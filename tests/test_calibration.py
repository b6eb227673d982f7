"""Calibration tables, the cost model on them, and where a calibration comes from (cache, bundled, flag)."""

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from sgl_sidp.calibration.cache import BUNDLED_DIR, CalibrationCache, CalibrationKey, find_bundled, resolve
from sgl_sidp.calibration.cache import default_cache_dir
from sgl_sidp.calibration.cost import DEFAULT_COPY_RATE_IN_FORWARD, DEFAULT_COPY_SLOWDOWN_MS_PER_GB, KVModel
from sgl_sidp.calibration.cost import copies_that_fit, hidden_fraction, spread
from sgl_sidp.calibration.table import Calibration, CalibrationError, ExpectedBatch, compare_decode

QWEN = "Qwen3MoeForCausalLM L48 E128 H2048 I768 A32/4 tp1"
KEY = CalibrationKey("NVIDIA H200", "M", "torch.bfloat16", "", "triton", "0.5.17")


def cal(decode_ms, **kw):
    """A calibration of model "M" on "H200" with the given decode times (ms by batch)."""
    kw.setdefault("prefill_ms", {})
    kw.setdefault("copy_gbps", None)
    return Calibration(kw.pop("model", "M"), kw.pop("gpu", "H200"), decode_ms, source="test", **kw)


# --------------------------------------------------------------------------- table
def test_json_round_trip_through_text():
    """to_json -> json text -> from_json gives back an equal calibration (int keys restored)."""
    c = cal({1: 5.5, 16: 14.25}, prefill_ms={2048: 44.4}, copy_gbps=342.0, decode_context={1: 2052},
            attention_gbps=3000.0, copy_slowdown_ms_per_gb=0.3, copy_rate_in_forward=0.75, sglang="0.5.17",
            measure_s=12.5, decode_ms_long={1: 6.5}, decode_context_long=2048)
    assert Calibration.from_json(json.loads(json.dumps(c.to_json()))) == c


def test_load_bundled_file():
    """The bundled H200 Qwen3-30B-A3B table loads with its numbers: SGLang's served forwards (`plan calibrate`,
    pipelined, two contexts) and ZeroDP's peer-copy figures from 4 x H200, which one GPU cannot time."""
    c = Calibration.load(BUNDLED_DIR / "h200_qwen3-30b-a3b_tp1.json")
    assert (c.model, c.gpu, c.decode_timing) == (QWEN, "NVIDIA H200", "pipelined")
    assert c.decode_ms[16] == pytest.approx(12.235, abs=1e-3) and c.decode_context[16] == 256
    assert c.decode_context_long == 2048 and c.prefill_ms[8192] == pytest.approx(231.74, abs=0.01)
    assert (c.copy_gbps, c.copy_slowdown_ms_per_gb, c.copy_rate_in_forward) == (342.0, 0.327, 0.8)
    assert find_bundled(QWEN, "NVIDIA H200") == BUNDLED_DIR / "h200_qwen3-30b-a3b_tp1.json"


def test_bundled_cache_entries_are_found_and_loaded_as_plain_tables_are():
    """`plan calibrate` bundles cache entries (`{"key", "calibration"}`): the start-up lookup (`find_bundled`,
    `resolve`) and `Calibration.load` read them too."""
    sig = "Qwen3ForCausalLM L36 H4096 I12288 A32/8 tp1"
    path = BUNDLED_DIR / "h200_qwen3-8b_tp1.json"
    assert "calibration" in json.loads(path.read_text()) and find_bundled(sig, "NVIDIA H200") == path
    c = Calibration.load(path)
    assert c == Calibration.from_entry(json.loads(path.read_text())) and (c.model, c.gpu) == (sig, "NVIDIA H200")
    key = CalibrationKey(gpu="NVIDIA H200", model=sig, dtype="torch.bfloat16", quantization="", attention_backend="triton",
                         sglang="0.5.17")
    cal, origin = resolve(key, None, CalibrationCache(Path("/nonexistent")))
    assert cal == c and origin == f"bundled {path}"


def test_missing_optional_keys_give_defaults():
    """Only model, gpu and decode_ms are required; the optional numbers come back as None or empty."""
    c = Calibration.from_json({"model": "M", "gpu": "H200", "decode_ms": {"4": 8}})
    assert (c.decode_ms, c.prefill_ms, c.decode_context, c.source, c.measure_s) == ({4: 8.0}, {}, {}, "", 0.0)
    assert (c.copy_gbps, c.copy_slowdown_ms_per_gb, c.copy_rate_in_forward, c.attention_gbps) == (None,) * 4
    with pytest.raises(KeyError):
        Calibration.from_json({"model": "M", "gpu": "H200"})


def test_forward_ms_interpolates_and_clamps():
    """Linear between measured points, the end values outside them."""
    c = cal({1: 10.0, 4: 16.0, 8: 20.0}, prefill_ms={1000: 50.0, 3000: 90.0})
    f = lambda text: c.forward_ms(ExpectedBatch.parse(text))
    assert f("decode:2") == pytest.approx(12.0)  # 10 + 1/3 * 6
    assert f("decode:6") == pytest.approx(18.0)  # 16 + 2/4 * 4
    assert (f("decode:1"), f("decode:100")) == (10.0, 20.0)
    assert (f("prefill:2000"), f("prefill:500"), f("prefill:9000")) == (70.0, 50.0, 90.0)


def test_forward_ms_refuses_kv_and_empty_tables():
    """A "kv" batch is not a fixed batch; a kind without points is a CalibrationError."""
    c = cal({1: 10.0})
    with pytest.raises(ValueError):
        c.forward_ms(ExpectedBatch("kv", 2048))
    with pytest.raises(CalibrationError):
        c.forward_ms(ExpectedBatch("prefill", 512))
    with pytest.raises(CalibrationError):
        cal({}).decode_step_ms(1, 100, 1000)


def test_decode_step_adds_context_beyond_the_measured_one():
    """Extra KV bytes beyond the measured context are read at attention_gbps; shorter contexts subtract nothing."""
    c = cal({1: 10.0, 4: 16.0, 8: 20.0}, decode_context={1: 100, 4: 100, 8: 100}, attention_gbps=2.0)
    # 4 sequences * 500 extra tokens * 1000 bytes = 2e6 bytes at 2e9 bytes/s = 1 ms
    assert c.decode_step_ms(4, 600, 1000) == pytest.approx(17.0)
    assert c.decode_step_ms(4, 50, 1000) == pytest.approx(16.0)
    assert dataclasses.replace(c, attention_gbps=None).decode_step_ms(4, 600, 1000) == pytest.approx(16.0)
    # no decode_context: measured context counts as 0; 1 * 500 * 1000 bytes at 2e9 bytes/s = 0.25 ms
    assert cal({1: 10.0}, attention_gbps=2.0).decode_step_ms(1, 500, 1000) == pytest.approx(10.25)


def test_decode_step_with_two_contexts_uses_each_batchs_own_cost_per_token():
    """Measured at 256 and 2,048 tokens: up to 2,048, a step's cost per token of context is read per batch
    (interpolated between batches; past the largest, each row costs the largest batch's); past 2,048, max(batch 1's
    cost, batch x the largest per-row cost of the batches at least twice batch 1's); attention_gbps is then unused.
    (On a GPU kind without a `LONG_CONTEXT_KV_GBPS`.)"""
    c = cal({1: 4.0, 4: 6.0, 16: 10.0}, decode_context={1: 256, 4: 256, 16: 256},
            decode_ms_long={1: 5.792, 16: 17.168}, decode_context_long=2048, attention_gbps=1e-3, gpu="H100")
    # per token of context: bs1 (5.792 - 4) / 1792 = 1e-3 ms a step, bs16 (17.168 - 10) / 1792 = 4e-3 (2.5e-4 a row)
    assert c.decode_step_ms(1, 2048, 1000) == pytest.approx(5.792)
    assert c.decode_step_ms(1, 1256, 1000) == pytest.approx(5.0)
    assert c.decode_step_ms(16, 4096, 1000) == pytest.approx(17.168 + 2048 * 16 * 2.5e-4)
    # bs4 has no long point: its step's cost lies between bs1's and bs16's (4 is 3/15 of the way)
    step = 1e-3 + (4 - 1) / 15 * (4e-3 - 1e-3)
    assert c.decode_step_ms(4, 1256, 1000) == pytest.approx(6.0 + 1000 * step)
    # past 2,048: max(1e-3, 4 x 2.5e-4) a token
    assert c.decode_step_ms(4, 4096, 1000) == pytest.approx(6.0 + 1792 * step + 2048 * 1e-3)
    assert c.decode_step_ms(2, 8192, 1000) == pytest.approx(4.0 + 2.0 / 3 + 1792 * 1.2e-3 + 6144 * 1e-3)  # bs1's floor
    assert c.decode_step_ms(64, 1256, 1000) == pytest.approx(10.0 + 64 * 1000 * 2.5e-4)  # per row past bs16
    assert c.decode_step_ms(4, 100, 1000) == pytest.approx(6.0)  # shorter contexts subtract nothing


def test_far_past_the_long_context_a_row_reads_its_kv_at_the_gpu_kinds_rate():
    """`LONG_CONTEXT_KV_GBPS`: past 2,048 tokens a row's cost per token of context is the time its KV bytes per token
    take at the kind's rate (H200 2,700 GB/s), whether the two contexts' per-row cost is higher or lower; never below
    batch 1's latency floor; up to 2,048 the measured slopes as before; a kind without a rate keeps the table's."""
    from sgl_sidp.calibration.table import LONG_CONTEXT_KV_GBPS

    assert LONG_CONTEXT_KV_GBPS == {"h200": 2700.0}  # keyed by `gpu_kind`, as calibrations are matched to GPUs
    kw = dict(decode_context={1: 256, 16: 256}, decode_ms_long={1: 5.792, 16: 17.168}, decode_context_long=2048)
    h200, h100 = cal({1: 4.0, 16: 10.0}, **kw), cal({1: 4.0, 16: 10.0}, gpu="NVIDIA H100 80GB HBM3", **kw)
    kv = 270_000  # bytes a token: 1e-4 ms at 2,700 GB/s, below the measured 2.5e-4 a row
    assert h200.decode_step_ms(16, 2048, kv) == h100.decode_step_ms(16, 2048, kv) == pytest.approx(17.168)
    assert h200.decode_step_ms(16, 4096, kv) == pytest.approx(17.168 + 2048 * max(1e-3, 16 * 1e-4))
    assert h100.decode_step_ms(16, 4096, kv) == pytest.approx(17.168 + 2048 * 16 * 2.5e-4)
    # a row whose KV takes longer at the rate than the table's per-row cost: the rate's, where the table's was taken
    # until session 41 (Qwen3-8B's TP2 shard at 64 rows of 11K: -15.7 % with the table's, -5.6 % with the rate)
    assert h200.decode_step_ms(16, 4096, 10 * kv) == pytest.approx(17.168 + 2048 * 16 * 1e-3)
    assert h100.decode_step_ms(16, 4096, 10 * kv) == pytest.approx(17.168 + 2048 * 16 * 2.5e-4)
    assert h200.decode_step_ms(4, 8192, kv) == pytest.approx(h200.decode_step_ms(4, 2048, kv) + 6144 * 1e-3)  # floor
    named = cal({1: 4.0, 16: 10.0}, gpu="NVIDIA H200", **kw)  # as NVML names it, where `cal` says "H200"
    assert named.decode_step_ms(16, 4096, 10 * kv) == h200.decode_step_ms(16, 4096, 10 * kv)


def test_compare_decode_lines():
    """One line per reference point, at that point's batch and context, sorted by batch."""
    measured = cal({16: 13.8, 64: 18.0}, decode_context={16: 2052, 64: 2052}, attention_gbps=2.0)
    reference = cal({64: 20.0, 1: 6.9, 16: 14.25}, decode_context={16: 2052, 64: 4100})
    # bs64: 64 seqs * 2048 extra tokens * 100 bytes = 13,107,200 bytes at 2e9 bytes/s = 6.5536 ms -> 24.5536
    assert compare_decode(measured, reference, kv_bytes_per_token=100) == [
        "bs1@0: 6.90 ms ref, 13.80 ms measured (2.00x)",
        "bs16@2052: 14.25 ms ref, 13.80 ms measured (0.97x)",
        "bs64@4100: 20.00 ms ref, 24.55 ms measured (1.23x)",
    ]


# --------------------------------------------------------------------------- cost model
def test_copies_that_fit():
    """Copies fill `margin` (0.85 by default) of the budget; free copies all fit; none fit a too-small budget."""
    assert copies_that_fit(2.0, 10.0) == 4  # 8.5 ms of room
    assert copies_that_fit(2.0, 10.0, margin=1.0) == 5
    assert copies_that_fit(3.0, 2.0) == 0 and copies_that_fit(2.0, 0.0) == 0
    assert copies_that_fit(0.0, 10.0) == 1 << 30 and copies_that_fit(-1.0, 10.0) == 1 << 30


def test_hidden_fraction():
    """forward / copy, capped at 1; no copy is fully hidden."""
    assert (hidden_fraction(10.0, 5.0), hidden_fraction(5.0, 10.0), hidden_fraction(0.0, 5.0)) == (0.5, 1.0, 1.0)


def test_spread():
    """Evenly spaced picks ending at the last candidate; phase shifts them earlier; n >= L all, n <= 0 none."""
    c = list(range(10, 22))  # 12 candidates, stride 4 for n = 3
    assert spread(c, 3) == (13, 17, 21)
    assert spread(c, 3, phase=0.5) == (11, 15, 19)  # 2 of the stride of 4 earlier
    assert spread(c, 1) == (21,)
    assert spread(list(range(10)), 4) == (2, 4, 7, 9)  # stride 2.5: ceil(1.5), 4, ceil(6.5), 9
    assert spread([5, 7, 9], 3) == (5, 7, 9) and spread([5, 7, 9], 8) == (5, 7, 9)
    assert spread(c, 0) == () and spread(c, -2) == ()


# decode 10 ms at batch 1, +0.1 ms per extra sequence; 1e6 KV bytes per sequence (1000 tokens * 1000 bytes)
KV_CAL = cal({1: 10.0, 101: 20.0}, copy_slowdown_ms_per_gb=1.0, copy_rate_in_forward=0.5)
LAYER = 10_000_000  # 10 MB: 10 more sequences per streamed layer beyond the slots


def kv(calibration=KV_CAL, **kw):
    return KVModel(vanilla_kv_bytes=40e6, kv_bytes_per_token=1000, context=1000, calibration=calibration, **kw)


def test_kv_model_compute_bound_and_copy_bound():
    """4 streamed layers, 2 slots: 60 sequences; the step is the longer of forward (+ slowdown) and copies."""
    b, step, tps = kv().tokens_per_s(4, LAYER, copy_gbps=100.0)
    assert b == pytest.approx(60.0)  # 40 + 2 layers of extra KV (10 sequences each)
    assert step == pytest.approx(10.0 + 0.1 * 59 + 1.0 * 0.04)  # 0.04 GB pulled; copies 0.04 GB / 50 GB/s = 0.8 ms
    assert tps == pytest.approx(60.0 / step * 1e3)
    b, step, tps = kv().tokens_per_s(4, LAYER, copy_gbps=1.0)
    assert (b, step, tps) == pytest.approx((60.0, 80.0, 750.0))  # 0.04 GB at 0.5 * 1 GB/s = 80 ms


def test_kv_model_slots_and_cap():
    """Layers up to n_slots add no KV; max_batch caps the batch; the batch is at least 1."""
    assert kv().tokens_per_s(1, LAYER, 100.0)[0] == pytest.approx(40.0)
    assert kv().tokens_per_s(0, LAYER, 100.0)[1] == pytest.approx(13.9)
    assert kv(n_slots=3).tokens_per_s(4, LAYER, 100.0)[0] == pytest.approx(50.0)
    b, step, _ = kv(max_batch=50).tokens_per_s(4, LAYER, 100.0)
    assert b == 50 and step == pytest.approx(10.0 + 0.1 * 49 + 0.04)
    assert KVModel(1e6, 1000, 1000, KV_CAL).batch(0) == 1.0 and KVModel(1e5, 1000, 1000, KV_CAL).batch(0) == 1.0


def test_kv_model_defaults_where_not_measured():
    """Unmeasured slowdown and in-forward rate fall back to the H200 defaults; a measured 0 slowdown is kept."""
    assert (DEFAULT_COPY_SLOWDOWN_MS_PER_GB, DEFAULT_COPY_RATE_IN_FORWARD) == (0.327, 0.8)
    unmeasured = cal({1: 10.0, 101: 20.0})
    assert kv(unmeasured).tokens_per_s(4, LAYER, 100.0)[1] == pytest.approx(15.9 + 0.327 * 0.04)
    assert kv(unmeasured).tokens_per_s(4, LAYER, 1.0)[1] == pytest.approx(50.0)  # 0.04 GB at 0.8 GB/s
    no_slowdown = dataclasses.replace(KV_CAL, copy_slowdown_ms_per_gb=0.0)
    assert kv(no_slowdown).tokens_per_s(4, LAYER, 100.0)[1] == pytest.approx(15.9)


# --------------------------------------------------------------------------- cache
def test_key_file_name_stable_and_distinct():
    """Equal keys share a file name; changing any one field changes it."""
    assert KEY.file_name() == CalibrationKey(*dataclasses.astuple(KEY)).file_name()
    assert KEY.file_name().startswith("NVIDIA_H200_M-") and KEY.file_name().endswith(".json")
    changes = dict(gpu="NVIDIA H100", model="M2", dtype="torch.float16", quantization="fp8",
                   attention_backend="fa3", sglang="0.5.18", format=KEY.format + 1)
    names = {dataclasses.replace(KEY, **{f: v}).file_name() for f, v in changes.items()}
    assert len(names) == len(changes) and KEY.file_name() not in names


def test_cache_round_trip_and_atomic_put(tmp_path):
    """put then get returns the calibration; only the final file is left in the directory."""
    cache = CalibrationCache(tmp_path / "sub")
    c = cal({1: 8.0}, copy_gbps=390.0)
    path = cache.put(KEY, c)
    assert path == tmp_path / "sub" / KEY.file_name() and cache.get(KEY) == c
    cache.put(KEY, dataclasses.replace(c, copy_gbps=200.0))
    assert cache.get(KEY).copy_gbps == 200.0
    assert [p.name for p in (tmp_path / "sub").iterdir()] == [KEY.file_name()]


def test_cache_get_misses(tmp_path):
    """get is None for a missing file, a corrupt one, and one stored under another key."""
    cache = CalibrationCache(tmp_path)
    assert cache.get(KEY) is None
    cache.path(KEY).write_text("{not json")
    assert cache.get(KEY) is None
    other = dataclasses.asdict(dataclasses.replace(KEY, sglang="0.4.0"))
    cache.path(KEY).write_text(json.dumps({"key": other, "calibration": cal({1: 8.0}).to_json()}))
    assert cache.get(KEY) is None


def test_cache_wait(tmp_path):
    """wait returns once another thread puts the entry, None on timeout, None at once when not alive."""
    cache, t0 = CalibrationCache(tmp_path), time.monotonic()
    assert cache.wait(KEY, timeout_s=0.05, poll_s=0.01) is None
    assert cache.wait(KEY, timeout_s=30, alive=lambda: False, poll_s=0.01) is None
    writer = threading.Timer(0.1, lambda: cache.put(KEY, cal({1: 8.0})))
    writer.start()
    assert cache.wait(KEY, timeout_s=30, poll_s=0.01) == cal({1: 8.0})
    assert time.monotonic() - t0 < 5  # neither the dead wait nor the successful one ran to its 30 s timeout
    writer.join()


def test_default_cache_dir(monkeypatch, tmp_path):
    """$SIDP_CALIBRATION_DIR if set, else ~/.cache/sgl-sidp/calibration."""
    monkeypatch.setenv("SIDP_CALIBRATION_DIR", str(tmp_path / "cal"))
    assert default_cache_dir() == tmp_path / "cal" and CalibrationCache().dir == tmp_path / "cal"
    monkeypatch.delenv("SIDP_CALIBRATION_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "sgl-sidp" / "calibration"


# --------------------------------------------------------------------------- resolve
def write(path: Path, c: Calibration) -> str:
    path.write_text(json.dumps(c.to_json()))
    return str(path)


def test_resolve_order(tmp_path):
    """A flag file beats a bundled table, which beats the cache, which beats nothing."""
    bundled_dir, cache = tmp_path / "bundled", CalibrationCache(tmp_path / "cache")
    bundled_dir.mkdir()
    flag = write(tmp_path / "flag.json", cal({1: 1.0}))
    bundled = write(bundled_dir / "h200_m.json", cal({1: 2.0}))
    cache.put(KEY, cal({1: 3.0}))
    assert resolve(KEY, flag, cache, bundled_dir) == (cal({1: 1.0}), f"flag {flag}")
    assert resolve(KEY, None, cache, bundled_dir) == (cal({1: 2.0}), f"bundled {bundled}")
    Path(bundled).unlink()
    assert resolve(KEY, None, cache, bundled_dir) == (cal({1: 3.0}), f"cache {cache.path(KEY)}")
    cache.path(KEY).unlink()
    assert resolve(KEY, None, cache, bundled_dir) == (None, "none")


def test_bundled_matches_model_and_gpu_name(tmp_path):
    """A bundled table for another model or GPU is skipped; the file's gpu matches inside the name, any case."""
    cache = CalibrationCache(tmp_path / "cache")
    cache.put(KEY, cal({1: 3.0}))
    write(tmp_path / "other_model.json", cal({1: 2.0}, model="M2"))
    write(tmp_path / "other_gpu.json", cal({1: 2.0}, gpu="H100"))
    assert resolve(KEY, None, cache, tmp_path)[1].startswith("cache ")
    lower = write(tmp_path / "lower.json", cal({1: 2.0}, gpu="h200"))
    assert resolve(KEY, None, cache, tmp_path) == (cal({1: 2.0}, gpu="h200"), f"bundled {lower}")
    assert find_bundled("M", "NVIDIA H100 80GB HBM3", tmp_path) == tmp_path / "other_gpu.json"


def test_unreadable_flag_file_raises(tmp_path):
    """A named file that is missing, corrupt or incomplete is an error, not a fallback."""
    cache = CalibrationCache(tmp_path)
    with pytest.raises(OSError):
        resolve(KEY, str(tmp_path / "missing.json"), cache, tmp_path)
    (tmp_path / "bad.txt").write_text("{")
    with pytest.raises(ValueError):
        resolve(KEY, str(tmp_path / "bad.txt"), cache, tmp_path)
    (tmp_path / "partial.txt").write_text(json.dumps({"model": "M", "gpu": "H200"}))
    with pytest.raises(KeyError):
        resolve(KEY, str(tmp_path / "partial.txt"), cache, tmp_path)


def test_bundled_gpu_names_match_whole_words_and_bad_files_are_skipped(tmp_path):
    """"H20" is another GPU than "H200"; an empty gpu matches nothing; an unreadable table does not hide the others;
    a cache file that is JSON but not an entry reads as a miss."""
    model = "Qwen3MoeForCausalLM L48 E128 H2048 I768 A32/4 tp1"
    base = {"model": model, "decode_ms": {"1": 5.0}, "prefill_ms": {}, "copy_gbps": 1.0}
    (tmp_path / "a_broken.json").write_text("[1, 2")
    (tmp_path / "b_empty.json").write_text(json.dumps({**base, "gpu": ""}))
    (tmp_path / "c_h20.json").write_text(json.dumps({**base, "gpu": "H20"}))
    assert find_bundled(model, "NVIDIA H200", tmp_path) is None
    (tmp_path / "d_h200.json").write_text(json.dumps({**base, "gpu": "H200"}))
    assert find_bundled(model, "NVIDIA H200", tmp_path) == tmp_path / "d_h200.json"
    assert find_bundled(model, "NVIDIA H200 NVL", tmp_path) == tmp_path / "d_h200.json"
    assert find_bundled(model, "NVIDIA H20", tmp_path) == tmp_path / "c_h20.json"
    cache = CalibrationCache(tmp_path / "cache")
    key = CalibrationKey("NVIDIA H200", model, "torch.bfloat16", "", "triton", "0.5.17")
    cache.path(key).parent.mkdir(parents=True)
    cache.path(key).write_text("[1]")
    assert cache.get(key) is None


def test_decode_step_interpolates_as_numpy_does():
    """`decode_step_ms` interpolates one point at a time (the planner asks for millions): the same numbers as
    `numpy.interp` over the table, clamped at both ends, on a bundled table with two contexts (H200: past the long
    context a row reads its KV at `LONG_CONTEXT_KV_GBPS`)."""
    import json

    import numpy as np

    from sgl_sidp.calibration.cache import BUNDLED_DIR
    from sgl_sidp.calibration.table import LONG_CONTEXT_KV_GBPS, Calibration

    d = json.loads((BUNDLED_DIR / "h200_qwen3-8b_tp1.json").read_text())
    c = Calibration.from_json(d.get("calibration", d))
    xs = sorted(c.decode_ms)
    lx = sorted(c.decode_ms_long)
    slope = [max(0.0, c.decode_ms_long[b] - c.decode_ms[b]) / (c.decode_context_long - c.decode_context[b]) for b in lx]
    floor, per_row = slope[0], 147_456 / (LONG_CONTEXT_KV_GBPS["h200"] * 1e6)  # ms a token of a row's KV
    for b in (0.5, 1, 3, 16, 100.5, 256, 400):
        for ctx in (0, 256, 2048, 3000):
            ms = np.interp(b, xs, [c.decode_ms[x] for x in xs])
            point = np.interp(b, xs, [c.decode_context[x] for x in xs])
            extra = max(0.0, ctx - point)
            near = np.interp(b, lx, slope) if b <= lx[-1] else slope[-1] * b / lx[-1]
            span = c.decode_context_long - point
            want = ms + near * min(extra, span) + max(floor, b * per_row) * max(0.0, extra - span)
            assert c.decode_step_ms(b, ctx, 147_456) == pytest.approx(float(want), rel=1e-12)
