#!/bin/bash
# one H200, vanilla Qwen3-30B-A3B TP1: KV, TTFT, decode steps, burst, the Azure code replay kept up with
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/gpu_env.sh
( time timeout 570 python3 scripts/plan_validate_1gpu.py measure --model-path .gpu/models/Qwen3-30B-A3B --out-dir $OUT/val \
  --trace azure_ok='--trace .gpu/traces/AzureLLMInferenceTrace_code.csv --start-s 600 --duration-s 120' ) > $OUT/validate.txt 2>&1
echo "validate rc=$?" >> $OUT/validate.txt
cd $OUT && gzip val/server.log; tar czf val.tgz val && rm -rf val
