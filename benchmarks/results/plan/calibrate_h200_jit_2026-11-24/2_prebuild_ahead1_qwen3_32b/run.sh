#!/bin/bash
# one H200, fresh host: plan calibrate --gpus 8 for Qwen3-32B with SGLang's JIT kernels built ahead (jit_prebuild),
# then Qwen3-30B-A3B with empty tvm-ffi and Triton caches of its own (the disk warm), as time allows.
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > $OUT/gpu.txt
for m in Qwen3-32B Qwen3-30B-A3B; do
  left=$(( 585 - ( $(date +%s) - t0 ) )); [ $left -lt 120 ] && break
  if [ $m = Qwen3-30B-A3B ]; then export TVM_FFI_CACHE_DIR=/tmp/tvm2 TRITON_CACHE_DIR=/tmp/triton2; fi
  mkdir -p $OUT/$m/cal; export SIDP_CALIBRATION_DIR=$OUT/$m/cal; touch $OUT/$m/start
  ( while true; do echo "== $(date +%T)"; ps -eo pcpu,etimes,comm,args --sort=-pcpu | head -6 | cut -c1-160; sleep 2; done ) > $OUT/$m/monitor.txt 2>&1 &
  mon=$!
  ( time timeout $left python3 -m sgl_sidp.plan calibrate --model-path .gpu/models/$m --gpus 8 ) > $OUT/$m/gpus8.txt 2>&1
  echo "$m gpus 8 rc=$? $(( $(date +%s) - t0 )) s since the call's start" >> $OUT/times.txt
  kill $mon
  find ${TVM_FFI_CACHE_DIR:-$HOME/.cache/tvm-ffi} -name "*.so" -printf '%T@ %p\n' | sort -n > $OUT/$m/jit_so.txt
  (cd $OUT/$m && gzip monitor.txt && tar czf logs.tgz cal/*.log cal/jit-prebuild.* && mkdir -p entries && cp cal/*.json entries/ 2>/dev/null; rm -rf cal)
done
cd $OUT && tar czf all.tgz */ times.txt gpu.txt && rm -rf Qwen3-*
