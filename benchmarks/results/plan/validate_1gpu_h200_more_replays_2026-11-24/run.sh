#!/bin/bash
# one H200: vanilla Qwen3-30B-A3B TP1 Mooncake replay kept up with + Azure at half the gaps; Qwen3-8B Azure at half the gaps
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/gpu_env.sh
t0=$(date +%s)
( time timeout 330 python3 scripts/plan_validate_1gpu.py measure --model-path .gpu/models/Qwen3-30B-A3B --out-dir $OUT/moe \
  --ttft "" --decode-contexts "" --burst "" \
  --trace azure_half='--trace .gpu/traces/AzureLLMInferenceTrace_code.csv --start-s 600 --duration-s 120 --time-scale 0.5' \
  --trace mooncake_ok='--trace .gpu/traces/conversation_trace.jsonl --start-s 600 --duration-s 30 --time-scale 4 --max-context-len 32768' ) > $OUT/moe.txt 2>&1
echo "moe rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/times.txt
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9; sleep 2
left=$(( 575 - ( $(date +%s) - t0 ) ))
( time timeout $left python3 scripts/plan_validate_1gpu.py measure --model-path .gpu/models/Qwen3-8B --out-dir $OUT/dense \
  --ttft "" --decode-contexts "" --burst "" \
  --trace azure_half='--trace .gpu/traces/AzureLLMInferenceTrace_code.csv --start-s 600 --duration-s 120 --time-scale 0.5' ) > $OUT/dense.txt 2>&1
echo "dense rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/times.txt
cd $OUT && for d in moe dense; do [ -f $d/server.log ] && gzip $d/server.log; done; tar czf val.tgz moe dense *.txt; rm -rf moe dense
