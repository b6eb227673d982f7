#!/bin/bash
# one H200: Qwen3-8B vanilla TP1, the Azure replay at twice the kept-up rate, measured again (is its TPOT p50 stable?)
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/gpu_env.sh
( time timeout 400 python3 scripts/plan_validate_1gpu.py measure --model-path .gpu/models/Qwen3-8B --out-dir $OUT/dense \
  --ttft "" --decode-contexts "" --burst "" \
  --trace azure_half='--trace .gpu/traces/AzureLLMInferenceTrace_code.csv --start-s 600 --duration-s 120 --time-scale 0.5' ) > $OUT/dense.txt 2>&1
echo "rc=$?" >> $OUT/dense.txt
cd $OUT && gzip dense/server.log; tar czf val.tgz dense dense.txt; rm -rf dense
