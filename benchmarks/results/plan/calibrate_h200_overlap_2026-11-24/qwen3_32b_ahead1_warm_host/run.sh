#!/bin/bash
# one H200, fresh caches: plan calibrate --gpus 8 --servers-ahead 1 (the default) for Qwen3-32B.
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/gpu_env.sh
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > $OUT/gpu.txt
for m in Qwen3-32B; do
  left=$(( 575 - ( $(date +%s) - t0 ) )); [ $left -lt 60 ] && break
  mkdir -p $OUT/$m/cal; export SIDP_CALIBRATION_DIR=$OUT/$m/cal
  ( time timeout $left python3 -m sgl_sidp.plan calibrate --model-path .gpu/models/$m --gpus 8 --servers-ahead 1 ) > $OUT/$m/gpus8.txt 2>&1
  echo "$m gpus 8 ahead 1 rc=$? $(( $(date +%s) - t0 )) s since the call's start" >> $OUT/times.txt
  (cd $OUT/$m && tar czf server_logs.tgz cal/*.log && mkdir -p entries && cp cal/*.json entries/ 2>/dev/null; rm -rf cal)
done
cd $OUT && tar czf all.tgz */ times.txt gpu.txt
