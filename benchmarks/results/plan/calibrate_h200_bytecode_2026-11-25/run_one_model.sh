#!/bin/bash
# one H200, fresh host: plan calibrate --gpus 8 --servers-ahead ${2:-2} for model $1 (empty caches), with a CPU monitor.
m=$1; ahead=${2:-2}
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
{ env | grep -i "^python"; python3 -c "import sys; print('dont_write_bytecode', sys.flags.dont_write_bytecode)"; } > $OUT/pyenv.txt 2>&1
source scripts/gpu_env.sh
echo "gpu_env.sh (unpack, bytecode, pip) $(( $(date +%s) - t0 )) s; pyc files: $(find /tmp/site -name '*.pyc' | wc -l)" >> $OUT/pyenv.txt
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > $OUT/gpu.txt
mkdir -p $OUT/$m/cal; export SIDP_CALIBRATION_DIR=$OUT/$m/cal; date +%T > $OUT/$m/start
( while true; do echo "== $(date +%T)"; ps -eo pcpu,etimes,comm,args --sort=-pcpu | head -6 | cut -c1-160; sleep 2; done ) > $OUT/$m/monitor.txt 2>&1 &
mon=$!
left=$(( ${3:-585} - ( $(date +%s) - t0 ) ))
( time timeout $left python3 -m sgl_sidp.plan calibrate --model-path .gpu/models/$m --gpus 8 --servers-ahead $ahead ) > $OUT/$m/gpus8.txt 2>&1
echo "$m gpus 8 ahead $ahead rc=$? $(( $(date +%s) - t0 )) s since the call's start" >> $OUT/times.txt
kill $mon
find ${TVM_FFI_CACHE_DIR:-$HOME/.cache/tvm-ffi} -name "*.so" -printf '%T@ %p\n' | sort -n > $OUT/$m/jit_so.txt
(cd $OUT/$m && gzip monitor.txt && tar czf logs.tgz cal/*.log cal/jit-prebuild.* && mkdir -p entries && cp cal/*.json entries/ 2>/dev/null; rm -rf cal)
cd $OUT && tar czf all.tgz */ times.txt gpu.txt pyenv.txt && rm -rf $m
