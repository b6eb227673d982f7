#!/bin/bash
# one H200, fresh host: how long SGLang's .py -> .pyc compile takes (pip does it at install, our tarball does not),
# then plan calibrate --gpus 8 for Qwen3-32B with a monitor of what compiles (Triton cache, processes) during it.
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
( time source scripts/gpu_env.sh ) > $OUT/gpu_env_time.txt 2>&1
source scripts/gpu_env.sh
ls /tmp/site/sglang/srt/__pycache__ 2>/dev/null | head -3 >> $OUT/gpu_env_time.txt
( time python3 -m compileall -q -j 0 /tmp/site ) >> $OUT/gpu_env_time.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > $OUT/gpu.txt
touch $OUT/start
( while true; do
    echo "== $(date +%T) triton=$(find ~/.triton/cache -type f 2>/dev/null | wc -l) inductor=$(find /tmp/torchinductor_* -type f 2>/dev/null | wc -l) dotcache=$(find ~/.cache -type f -newer $OUT/start 2>/dev/null | wc -l)"
    ps -eo pcpu,etimes,comm,args --sort=-pcpu | head -7 | cut -c1-220
    sleep 2
  done ) > $OUT/monitor.txt 2>&1 &
mon=$!
mkdir -p $OUT/cal; export SIDP_CALIBRATION_DIR=$OUT/cal
( time timeout 480 python3 -m sgl_sidp.plan calibrate --model-path .gpu/models/Qwen3-32B --gpus 8 ) > $OUT/gpus8.txt 2>&1
echo "rc=$? $(( $(date +%s) - t0 )) s since the call's start" >> $OUT/gpus8.txt
kill $mon
find ~/.triton ~/.cache /tmp/torchinductor_* -type f -newer $OUT/start -printf '%T@ %s %p\n' 2>/dev/null | sort -n > $OUT/new_files.txt
cd $OUT && tar czf server_logs.tgz cal/*.log && mkdir -p entries && cp cal/*.json entries/ 2>/dev/null; rm -rf cal; gzip monitor.txt
