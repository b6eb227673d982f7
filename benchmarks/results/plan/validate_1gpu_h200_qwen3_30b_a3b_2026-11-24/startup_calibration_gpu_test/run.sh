#!/bin/bash
# one H200: the start-up calibration GPU test against the new bundled Qwen3-30B-A3B TP1 table
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/gpu_env.sh
export SIDP_GPU_LOGS=$OUT/logs SIDP_MODELS_DIR=$PWD/.gpu/models
( time timeout 560 python3 -m pytest -m gpu tests/gpu/test_calibration_gpu.py -v -p no:cacheprovider ) > $OUT/pytest.txt 2>&1
echo "rc=$?" >> $OUT/pytest.txt
cd $OUT && tar czf logs.tgz logs 2>/dev/null; rm -rf logs
