#!/bin/bash
# Start-up calibration and KV capacity of one model on one GPU: starts our launcher with --overlay-calibrate (plain
# SGLang otherwise), waits for "The server is fired up", stops it, and prints the calibration lines, the cache entry
# and SGLang's max_total_num_tokens. Run once per budget: the cache entry is written by the first start only.
# Usage (GPU host, repo root, .whl and .gpu carried): bash scripts/gpu_calibrate_model.sh OUT_DIR MODEL_DIR [flags...]
#   OUT_DIR: where the server log (gzipped) goes; MODEL_DIR: the model's folder (served with dummy weights);
#   flags: more flags for the server (e.g. --mem-fraction-static 0.8).
# Environment: SIDP_CALIBRATION_DIR (optional): the calibration cache folder the launcher writes to and reads from
#   (default: OUT_DIR/calibration).
set -u
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
[ $# -ge 2 ] || { echo "usage: bash scripts/gpu_calibrate_model.sh OUT_DIR MODEL_DIR [flags...] (--help for more)" >&2; exit 2; }
source scripts/gpu_env.sh
OUTD=$1; M=$2; shift 2; mkdir -p "$OUTD"
NAME=$(basename "$M")$(echo "$*" | tr -c 'A-Za-z0-9.\n' '_' | sed 's/^/_/; s/_*$//')
export SIDP_CALIBRATION_DIR=${SIDP_CALIBRATION_DIR:-$OUTD/calibration}
LOG=$OUTD/$NAME.log
python3 -m sgl_sidp.launch_server --model-path "$M" --load-format dummy --attention-backend triton \
  --sampling-backend pytorch --tokenizer-path sgl_sidp/default_model --overlay-calibrate --port 34000 "$@" > "$LOG" 2>&1 &
P=$!
for _ in $(seq 1 200); do
  kill -0 $P 2>/dev/null || { echo "$NAME: server exited"; break; }
  grep -q "The server is fired up" "$LOG" && break; sleep 1
done
kill $P 2>/dev/null; sleep 3; pkill -f "port 34000" 2>/dev/null
echo "== $NAME"; grep -h -E "max_total_num_tokens=|start-up calibration|Error|error:" "$LOG" | cut -c1-1500 | head -6
gzip -f "$LOG"
