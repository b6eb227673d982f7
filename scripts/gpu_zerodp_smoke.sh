#!/bin/bash
# ZeroDP first GPU run (4 x H200): copy micro-benchmark, vanilla forward times, a zerodp server
# (source GPU 0, sink GPU 1) checked against a vanilla server (GPU 3). Results under $OUT.
set -u
source scripts/gpu_env.sh
M=.gpu/models/Qwen3-30B-A3B
COMMON="--model-path $M --load-format dummy --attention-backend triton --sampling-backend pytorch"
nvidia-smi topo -m > $OUT/topo.txt 2>&1
timeout 240 python scripts/zerodp_copy_bench.py --source-gpu 0 --sink-gpus 1,2,3 --out $OUT/copy_bench.json > $OUT/copy_bench.log 2>&1
cat $OUT/copy_bench.log | tail -12
( CUDA_VISIBLE_DEVICES=2 timeout 330 python -m sglang.bench_one_batch $COMMON --batch-size 1 2 4 16 64 --input-len 2048 --output-len 8 > $OUT/bench_one_batch_2k.log 2>&1
  CUDA_VISIBLE_DEVICES=2 timeout 200 python -m sglang.bench_one_batch $COMMON --batch-size 128 256 --input-len 256 --output-len 8 > $OUT/bench_one_batch_short.log 2>&1 ) &
BOB=$!
python -m sgl_sidp.launch_server $COMMON --dp-size 2 --sidp-mode zerodp --port 30000 --enable-metrics ${ZERODP_EXTRA:-} > $OUT/zerodp_server.log 2>&1 &
CUDA_VISIBLE_DEVICES=3 python -m sglang.launch_server $COMMON --port 30100 > $OUT/vanilla_server.log 2>&1 &
for p in 30000 30100; do
  for i in $(seq 1 200); do curl -sf localhost:$p/health_generate >/dev/null && break; sleep 2; done
done
python scripts/zerodp_smoke_client.py --ours http://127.0.0.1:30000 --vanilla http://127.0.0.1:30100 --out $OUT/smoke.json 2>&1 | tail -12
curl -s localhost:30000/metrics | grep "sidp" | head -20 > $OUT/metrics_sidp.txt
grep -h "sgl-sidp\|max_total_num_tokens=\|Error\|error\|Traceback" $OUT/zerodp_server.log | head -40
wait $BOB
grep -h "Prefill. latency\|Decode.  median\|Benchmark" $OUT/bench_one_batch_*.log | head -40
pkill -f sglang; sleep 3
cd $OUT && gzip -f *_server.log bench_one_batch_*.log
