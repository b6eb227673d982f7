#!/bin/bash
# KV capacity of two servers started side by side on a 4 x H200 host, at SGLang's default memory budget: SGLang's
# DWDP (--dwdp-size 2 --tp-size 2, GPUs 0,1) and ZeroDP offloading every layer (--zerodp-layers all, GPUs 2,3).
# Each is started, asked for one greedy completion (does it serve?), and stopped; max_total_num_tokens per rank comes
# from the server logs. Writes OUT_DIR/{dwdp,zerodp_all}.log.gz.
# Caveat (benchmarks/results/zerodp/README.md, round 2): the request goes out once /health answers, before SGLang
# logs "The server is fired up"; in our runs it crashed vanilla SGLang and ZeroDP alike ("CUDA error: invalid
# argument" in fused_topk), so only the capacity lines are evidence. python -m sgl_sidp.bench.compare waits properly.
# Usage (repo root): bash scripts/gpu_capacity_probe.sh OUT_DIR [extra flags for both servers]
set -u
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_capacity_probe.sh OUT_DIR [extra flags for both servers] (--help for more)" >&2; exit 2; }
source scripts/gpu_env.sh
OUTD=$1; shift; mkdir -p "$OUTD"
M=.gpu/models/Qwen3-30B-A3B
COMMON="--model-path $M --load-format dummy --attention-backend triton --sampling-backend pytorch --host 127.0.0.1 $*"
CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server $COMMON --dwdp-size 2 --tp-size 2 --port 33000 > "$OUTD/dwdp.log" 2>&1 &
P1=$!
CUDA_VISIBLE_DEVICES=2,3 python3 -m sgl_sidp.launch_server $COMMON --dp-size 2 --overlay-mode zerodp --zerodp-layers all --port 33100 > "$OUTD/zerodp_all.log" 2>&1 &
P2=$!
probe() {  # name port pid
  for _ in $(seq 1 100); do
    kill -0 "$3" 2>/dev/null || { echo "$1: server exited"; return; }
    curl -sf "http://127.0.0.1:$2/health" >/dev/null && break; sleep 2
  done
  echo "$1 /generate: $(curl -s -m 60 "http://127.0.0.1:$2/generate" -H 'Content-Type: application/json' \
    -d '{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}' | head -c 300)"
}
probe dwdp 33000 $P1 & Q1=$!
probe zerodp_all 33100 $P2 & Q2=$!
wait $Q1 $Q2
kill $P1 $P2 2>/dev/null; sleep 5; pkill -f "port 3300" 2>/dev/null; pkill -f "port 3310" 2>/dev/null
for f in dwdp zerodp_all; do
  echo "== $f"; grep -h -E "max_total_num_tokens=|sgl-sidp zerodp.*(KV cache|offloads)|DWDP enabled|Error|error:" "$OUTD/$f.log" | cut -c1-400 | head -8
  gzip -f "$OUTD/$f.log"
done
