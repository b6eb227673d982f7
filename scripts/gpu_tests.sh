#!/bin/bash
# `pytest -m gpu tests/gpu` on a lent GPU host, unfolded (a test that asks for more GPUs than the host has is skipped),
# resumable across device calls: the tests that passed or were skipped in an earlier call (NAME.tgz carried in
# .gpu/prev/) are deselected, and pytest is interrupted (SIGINT: fixtures stop their servers) BUDGET_S seconds in.
# The results folder (pytest.txt with every call's output, server logs, per-test facts) is packed into OUT/NAME.tgz.
# Usage (GPU host, repo root, .whl and .gpu carried): bash scripts/gpu_tests.sh NAME [PYTEST_ARGS...]
#   e.g. BUDGET_S=520 bash scripts/gpu_tests.sh gpu_tests_2gpu tests/gpu/test_sidp_gpu.py
# Environment: OUT (where NAME.tgz goes, default /tmp), BUDGET_S (default 540), RETRY_SKIPPED (1: deselect only what
# passed, so a host with more or bigger GPUs runs the tests an earlier host skipped), SIDP_COMMIT (the commit written in
# pytest.txt; default: git rev-parse, stale on a device host whose .git copy names an old HEAD), SHARDS (default 1;
# N: N pytest-xdist workers, each on its own 1/N of the host's GPUs, a test file's tests on one worker, a test that
# needs more GPUs than a worker has left for a call without SHARDS; tests/gpu/conftest.py).
set -u -o pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_tests.sh NAME [PYTEST_ARGS...] (--help for more)" >&2; exit 2; }
NAME=$1
shift
T0=$(date +%s)
source scripts/gpu_env.sh
RES=/tmp/gpu_tests/$NAME
mkdir -p "$RES/logs"
[ -f ".gpu/prev/$NAME.tgz" ] && tar xzf ".gpu/prev/$NAME.tgz" -C /tmp/gpu_tests
# an interrupted xdist worker may leave its test's server running (its own session): none outlives the call
trap 'pkill -9 -f "(sglang|sgl_sidp)\.launch_server" 2>/dev/null; tar czf "${OUT:-/tmp}/$NAME.tgz" -C /tmp/gpu_tests "$NAME"' EXIT
[ -f /tmp/tiny/qwen3-big/config.json ] || python3 .whl/make_tiny_models.py /tmp/tiny --big >/dev/null || exit 1
DONE=()
KEEP="PASSED|SKIPPED"; [ "${RETRY_SKIPPED:-0}" = 1 ] && KEEP="PASSED"  # a bigger host runs what an earlier one skipped
[ -f "$RES/pytest.txt" ] && while read -r id; do DONE+=(--deselect "$id"); done \
  < <(grep -oE "(^tests/gpu/[^ ]+ ($KEEP))|(($KEEP) tests/gpu/[^ ]+)" "$RES/pytest.txt" \
        | grep -oE 'tests/gpu/[^ ]+' | sort -u)  # "ID PASSED" alone, "[gw0] [ 5%] PASSED ID" under xdist
echo "=== call at $(date -u +%FT%TZ), commit ${SIDP_COMMIT:-$(git rev-parse --short HEAD)}, ${#DONE[@]} args deselecting what passed before" \
  | tee -a "$RES/pytest.txt"
nvidia-smi -L | tee -a "$RES/pytest.txt"
LEFT=$(( ${BUDGET_S:-540} - ($(date +%s) - T0) ))
XDIST=()
if [ "${SHARDS:-1}" -gt 1 ] && ! python3 -c "import xdist" 2>/dev/null; then
  echo "gpu_tests.sh: SHARDS=$SHARDS needs pytest-xdist, which this host lacks: one worker" | tee -a "$RES/pytest.txt"
  SHARDS=1
fi
if [ "${SHARDS:-1}" -gt 1 ]; then
  HOST_GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
  export SIDP_HOST_GPUS=$HOST_GPUS SIDP_GPUS_PER_WORKER=$(( $(echo "$HOST_GPUS" | tr , '\n' | wc -l) / SHARDS ))
  XDIST=(-n "$SHARDS" --dist loadfile)
fi
SIDP_MODELS_DIR=$PWD/.gpu/models SIDP_TINY_DENSE=/tmp/tiny/qwen3-big SIDP_TINY_MOE=/tmp/tiny/qwen3-moe-big \
  SIDP_GPU_LOGS=$RES/logs timeout -s INT -k 30 "$LEFT" \
  python3 -m pytest -m gpu -v -rs -p no:cacheprovider "${XDIST[@]}" "${DONE[@]}" "${@:-tests/gpu}" 2>&1 \
  | tee -a "$RES/pytest.txt"
