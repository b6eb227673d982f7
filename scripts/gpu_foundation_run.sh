#!/usr/bin/env bash
# Vanilla SGLang against our launcher with the overlay off (trace replays), and the GPU test suite, in one go, on a
# host with 4 GPUs, from the repo root:
#   RES=/tmp/foundation setsid nohup bash scripts/gpu_foundation_run.sh &
# Needs .whl/ (../shared/tools/make_gpu_wheelhouse.sh) and .gpu/ (model configs + traces, see README).
#   GPU0/GPU1: Azure code trace replay, vanilla SGLang on GPU0 vs our launcher (overlay off) on GPU1,
#              then `pytest -m gpu` (servers through our launcher; the --dp-size 2 case on GPU0+GPU1).
#   GPU2/GPU3: Mooncake conversation trace replay, vanilla on GPU2 vs ours on GPU3.
# Each side's server has one H200 to itself; both sides see the same requests at the same instants.
# Writes $RES/done_azure_pytest and $RES/done_mooncake when each lane ends.
# Environment: RES (optional): the folder for the results and logs (default: /tmp/foundation).
set -u
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
source scripts/gpu_env.sh
RES=${RES:-/tmp/foundation}
mkdir -p "$RES"
SERVER="--model-path .gpu/models/Qwen3-30B-A3B --load-format dummy --tokenizer-path sgl_sidp/default_model \
--attention-backend triton --sampling-backend pytorch"
SLO="--slo-ttft-ms 2000 --slo-tpot-ms 100"
(
  python3 scripts/compare_replay.py --out "$RES/azure_code" --gpus 0,1 --port-base 32000 --server-args "$SERVER" \
    --job "azure_code=--trace .gpu/traces/AzureLLMInferenceTrace_code.csv --start-s 0 --duration-s 600 --compress-gaps-s 5 $SLO" \
    >"$RES/azure_code.log" 2>&1
  SIDP_MODELS_DIR=$PWD/.gpu/models SIDP_GPU_LOGS="$RES/pytest_gpu_logs" \
    python3 -m pytest -m gpu tests/gpu -v -p no:cacheprovider >"$RES/pytest_gpu.log" 2>&1
  touch "$RES/done_azure_pytest"
) &
(
  python3 scripts/compare_replay.py --out "$RES/mooncake" --gpus 2,3 --port-base 33000 --server-args "$SERVER" \
    --job "mooncake_conversation=--trace .gpu/traces/conversation_trace.jsonl --start-s 0 --duration-s 300 --time-scale 2 --max-context-len 40960 $SLO" \
    >"$RES/mooncake.log" 2>&1
  touch "$RES/done_mooncake"
) &
wait
