"""`sgl_sidp.bench.profile`: SGLang's per-stage Chrome traces condensed into ms per forward by kernel class."""

from __future__ import annotations

import gzip
import json

import pytest

from sgl_sidp.bench import profile


def kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


@pytest.mark.parametrize("name, cls", [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("void cross_device_reduce_1stage<__nv_bfloat16, 2>(...)", "comm"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("nvjet_tst_192x192_64x4_1x2_h_bz_coopB_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "gemm"),
    ("_fwd_kernel", "attention"), ("_fwd_grouped_kernel_stage1", "attention"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)", "norm"),
    ("flashinfer::BatchPrefillWithPagedKVCacheKernel", "attention"),
    ("fused_moe_kernel", "moe"), ("void at::native::vectorized_elementwise_kernel<4, ...>", "other"),
])
def test_kernel_names_fall_into_their_class(name, cls):
    assert profile.kernel_class(name) == cls


def test_a_trace_is_condensed_per_forward_with_overlap_counted_once_in_busy():
    trace = {"traceEvents": [
        kernel("nvjet_gemm", 0, 600), kernel("ncclAllReduce", 500, 200),  # overlaps the GEMM by 100 us
        kernel("_fwd_kernel", 1000, 300), kernel("Memcpy DtoD", 1400, 100, cat="gpu_memcpy"),
        kernel("nvjet_gemm", 2000, 600),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # CPU side: not GPU time
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 0},  # not a complete event
    ]}
    s = profile.summarize_trace(trace, steps=2)
    assert s["kernels"] == 5 and s["steps"] == 2
    assert s["span_ms"] == pytest.approx(2.6 / 2) and s["busy_ms"] == pytest.approx((0.7 + 0.3 + 0.1 + 0.6) / 2)
    assert s["by_class_ms"] == {"gemm": 0.6, "attention": 0.15, "comm": 0.1, "copy": 0.05}
    assert s["top"][0] == ["nvjet_gemm", 0.6, 1]
    assert s["by_class_top"] == {"gemm": [["nvjet_gemm", 0.6, 1]], "attention": [["_fwd_kernel", 0.15, 0]],
                                 "comm": [["ncclAllReduce", 0.1, 0]], "copy": [["Memcpy DtoD", 0.05, 0]]}
    assert profile.summarize_trace(trace, steps=2, class_top=0)["by_class_top"] == {
        "gemm": [], "attention": [], "comm": [], "copy": []}


def test_a_trace_without_gpu_work_or_steps_is_refused():
    with pytest.raises(ValueError, match="no GPU event"):
        profile.summarize_trace({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1}]}, 1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        profile.summarize_trace({"traceEvents": [kernel("k", 0, 1)]}, 0)


def test_a_folder_of_sglang_traces_is_read_by_rank_and_stage_then_removed(tmp_path):
    for name in ("1.5-TP-0-DP-1-EXTEND", "1.5-TP-1-DECODE"):
        with gzip.open(tmp_path / f"{name}.trace.json.gz", "wt") as f:
            json.dump({"traceEvents": [kernel("nvjet", 0, 1000)]}, f)
    (tmp_path / "1.5-TP-2-DECODE.trace.json.gz").write_bytes(b"not gzip")
    (tmp_path / "other.trace.json.gz").write_bytes(b"")  # not SGLang's naming: left alone
    got = profile.summarize_dir(tmp_path, steps=1)
    assert got["TP-0-DP-1"]["prefill"]["busy_ms"] == 1.0 and got["TP-1"]["decode"]["span_ms"] == 1.0
    assert "error" in got["TP-2"]["decode"]
    assert [p.name for p in tmp_path.iterdir()] == ["other.trace.json.gz"]
    assert profile.trace_key(tmp_path / "x-TP-3-DP-0-EXTEND.trace.json.gz") == ("TP-3-DP-0", "prefill")


def test_waiting_for_traces_returns_once_the_files_stop_growing(tmp_path):
    assert profile.wait_for_traces(tmp_path, expected=1, timeout_s=1.0) == 0
    (tmp_path / "p-TP-0-EXTEND.trace.json.gz").write_bytes(b"x")
    assert profile.wait_for_traces(tmp_path, expected=1, timeout_s=5.0) == 1


def test_forwards_are_counted_from_the_attention_kernels_when_a_stage_ended_early():
    # 2 forwards of a 3-layer model traced where 3 were asked for (SGLang stops a prefill trace at the first decode)
    events = [kernel(name, 100 * i, 10) for i in range(2) for _ in range(3) for name in ("_fwd_kernel", "nvjet_gemm")]
    # FlashInfer's fused add-RMSNorm runs twice a layer: a norm, not an attention kernel to count forwards by
    events += [kernel("void flashinfer::norm::FusedAddRMSNormKernel", 0, 1) for _ in range(12)]
    s = profile.summarize_trace({"traceEvents": events}, steps=3, layers=3)
    assert s["steps"] == 2 and s["counted"] and s["by_class_ms"]["attention"] == pytest.approx(0.03)
    assert s["top"][0][2] == 3  # calls per forward
    # not a whole number of forwards: the steps asked for are the divisor
    odd = profile.summarize_trace({"traceEvents": events[:10]}, steps=3, layers=3)
    assert odd["steps"] == 3 and not odd["counted"]
    assert profile.forwards_in({"nvjet": (1.0, 6)}, 3) is None  # no attention kernel


def test_each_forward_splits_the_trace_at_the_idle_gap_before_the_first_layers_attention():
    def forward(t0, comm_us):  # a 2-layer forward: embedding, then per layer QKV GEMM, attention, all-reduce, MLP GEMM
        out, t = [kernel("embedding_kernel", t0, 5)], t0 + 5
        for _ in range(2):
            for name, dur in (("nvjet_qkv", 20), ("_fwd_kernel", 10), ("ncclDevKernel_AllReduce", comm_us),
                              ("nvjet_mlp", 30)):
                out.append(kernel(name, t, dur))
                t += dur
        return out
    # the first forward's all-reduces wait 200 us each for a late peer; the next starts after a 300 us idle gap, the
    # third right after the second (back to back, no gap to tell: its embedding and first GEMM count to the second)
    events = forward(0, 200) + forward(1130, 5) + forward(1265, 5)
    s = profile.summarize_trace({"traceEvents": events}, steps=3, layers=2)
    assert [f["start_ms"] for f in s["forwards"]] == [0.0, 1.13, 1.29]
    assert s["forwards"][0] == {"start_ms": 0.0, "span_ms": 0.525, "busy_ms": 0.525, "comm_ms": 0.4}
    assert s["forwards"][1]["comm_ms"] == 0.01 and s["forwards"][1]["span_ms"] == 0.16  # 0.135 + the next 0.025
    # without a count of the forwards there is no split
    assert "forwards" not in profile.summarize_trace({"traceEvents": events}, steps=3)


def test_the_hosts_long_cuda_calls_are_listed_where_the_cpu_was_traced():
    events = [kernel("_fwd_kernel", 1000, 50), kernel("nvjet", 1050, 50),
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 990, "dur": 8},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 1100, "dur": 2500},
              {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 800, "dur": 1500}]
    s = profile.summarize_trace({"traceEvents": events}, steps=1)
    assert s["host_waits"] == [[-0.2, 1.5, "cuLaunchKernel"], [0.1, 2.5, "cudaStreamSynchronize"]]
    assert "host_waits" not in profile.summarize_trace({"traceEvents": events[:2]}, steps=1)  # GPU activity only


def host(name, ts, dur, cat="python_function", tid=7, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def test_the_host_timeline_ties_each_kernel_to_its_launch_and_names_the_work_between_forwards():
    # two eager forwards of a 1-layer model: the host launches a GEMM and an attention kernel each (launches 10-30 and
    # 60-80 us into its forward frame, the GPU runs each kernel right after), then works 500 us between them (result
    # processing 300, schedule 200 with one aten op inside); the second forward's GPU lags its launches by 400 us
    events, corr = [], 0
    for t0, gpu_late in ((0, 0), (800, 400)):
        events.append(host("sglang/srt/model_executor/model_runner.py(1): forward", t0, 100))
        for j, (name, dur) in enumerate((("nvjet", 30), ("_fwd_kernel", 20))):
            corr += 1
            events.append(host("cudaLaunchKernel", t0 + 10 + 50 * j, 20, cat="cuda_runtime", corr=corr))
            k = kernel(name, t0 + 30 + 50 * j + gpu_late, dur)
            k["args"] = {"correlation": corr}
            events.append(k)
    events += [host("/x/site-packages/sglang/srt/managers/scheduler.py(9): process_batch_result", 100, 300),
               host("/x/site-packages/sglang/srt/managers/scheduler.py(5): get_next_batch_to_run", 400, 200),
               host("aten::copy_", 450, 50, cat="cpu_op"),
               host("other thread", 100, 600, tid=8)]
    s = profile.summarize_trace({"traceEvents": events}, steps=2, layers=1)
    tl = s["host"]
    assert tl["forwards"] == [
        {"launch_ms": 0.07, "gpu_ms": 0.07, "lag_ms": 0.02, "gap_ms": 0.73},
        {"launch_ms": 0.07, "gpu_ms": 0.07, "lag_ms": 0.42, "gap_ms": None}]
    # the gap 80..810 us: the result processing 300, the schedule 150 of its own, the aten op 50, the forward frames'
    # edges 30 (the first's tail 80-100, the second's head 800-810); the other thread is not the launching one
    assert tl["in_gaps"] == [["sglang/srt/managers/scheduler.py(9): process_batch_result", 0.3],
                             ["sglang/srt/managers/scheduler.py(5): get_next_batch_to_run", 0.15],
                             ["aten::copy_", 0.05], ["sglang/srt/model_executor/model_runner.py(1): forward", 0.03]]
    assert tl["in_launches"] == [["cudaLaunchKernel", 0.04],
                                 ["sglang/srt/model_executor/model_runner.py(1): forward", 0.03]]
    # recorded without the CPU activity: no timeline
    gpu_only = [e for e in events if e["cat"] == "kernel"]
    assert "host" not in profile.summarize_trace({"traceEvents": gpu_only}, steps=2, layers=1)


def test_exclusive_pieces_leave_each_frame_its_own_time_only():
    pieces = profile._exclusive_pieces([host("a", 0, 100), host("b", 10, 20), host("c", 50, 80)])  # c sticks out
    by = {}
    for name, lo, hi in pieces:
        by[name] = by.get(name, 0) + hi - lo
    assert by == {"a": 100 - 20 - 50, "b": 20, "c": 50}


def test_waiting_for_traces_settles_on_fewer_when_told_no_forward_is_left(tmp_path):
    (tmp_path / "p-TP-0-DECODE.trace.json.gz").write_bytes(b"x")  # a decode trace only: the prefill stage never began
    assert profile.wait_for_traces(tmp_path, expected=2, timeout_s=10.0, settle_s=1.0) == 1
