#!/bin/bash
# ZeroDP's fetch-vs-compute inputs on a 4 x H200 host (see benchmarks/results/zerodp/README.md): the copy
# micro-benchmark (source GPU 0, sinks 1..3) and vanilla forward times from sglang.bench_one_batch.
# Turn them into the table and the calibration file with scripts/zerodp_fetch_vs_compute.py.
# Usage (GPU host, repo root, .whl/ and .gpu/ present): OUT=DIR bash scripts/gpu_zerodp_microbench.sh
# Environment: OUT (required): the folder the results go to (topo.txt, copy_bench.json and .log,
#   bench_one_batch_*.log.gz); created if missing.
set -u
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
[ -n "${OUT:-}" ] || { echo "gpu_zerodp_microbench.sh: OUT is not set: set OUT=DIR, the folder for the results" >&2; exit 2; }
mkdir -p "$OUT"
source scripts/gpu_env.sh
M=.gpu/models/Qwen3-30B-A3B
COMMON="--model-path $M --load-format dummy --attention-backend triton --sampling-backend pytorch"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
timeout 240 python scripts/zerodp_copy_bench.py --source-gpu 0 --sink-gpus 1,2,3 --out "$OUT/copy_bench.json" > "$OUT/copy_bench.log" 2>&1
tail -8 "$OUT/copy_bench.log"
CUDA_VISIBLE_DEVICES=2 timeout 330 python -m sglang.bench_one_batch $COMMON --batch-size 1 2 4 16 64 --input-len 2048 --output-len 8 > "$OUT/bench_one_batch_2k.log" 2>&1
CUDA_VISIBLE_DEVICES=2 timeout 200 python -m sglang.bench_one_batch $COMMON --batch-size 128 256 --input-len 256 --output-len 8 > "$OUT/bench_one_batch_short.log" 2>&1
grep -h "Prefill. latency\|Decode.  median" "$OUT"/bench_one_batch_*.log
cd "$OUT" && gzip -f bench_one_batch_*.log
