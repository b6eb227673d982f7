#!/bin/bash
# `python -m sgl_sidp.bench.compare` on distinct-weight checkpoints of model families (scripts/make_family_models.py,
# built here), its results folder packed into OUT/NAME.tgz (a device call returns files, not folders). A NAME.tgz
# carried in .gpu/prev/ is unpacked first, so the next device call resumes the run.
# Usage (GPU host, repo root, .whl carried): bash scripts/gpu_compare_families.sh NAME "FAMILY ..." COMPARE_FLAGS...
#   e.g. bash scripts/gpu_compare_families.sh exact_2gpu "qwen3 llama" --gpus 0,1 --configs sidp_dp2_was --exact
# Environment: OUT (optional): where NAME.tgz goes (default: /tmp).
set -u -o pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
[ $# -ge 2 ] || { echo "usage: bash scripts/gpu_compare_families.sh NAME \"FAMILY ...\" COMPARE_FLAGS... (--help for more)" >&2; exit 2; }
NAME=$1 FAMS=$2
shift 2
source scripts/gpu_env.sh
RES=/tmp/compare_results
mkdir -p "$RES/$NAME" /tmp/fam
[ -f ".gpu/prev/$NAME.tgz" ] && tar xzf ".gpu/prev/$NAME.tgz" -C "$RES"
# a `timeout` around this script stops compare (it stops its servers); the results are packed in any case
trap 'echo "gpu_compare_families.sh: terminated, packing what was measured" >&2' TERM
trap 'tar czf "${OUT:-/tmp}/$NAME.tgz" -C "$RES" "$NAME"' EXIT
python3 scripts/make_family_models.py /tmp/fam $(for f in $FAMS; do printf -- '--family %s ' "$f"; done) || exit 1
MODELS=()
for f in $FAMS; do MODELS+=(--model-path "/tmp/fam/$f"); done
python3 -m sgl_sidp.bench.compare "${MODELS[@]}" --out-dir "$RES/$NAME" "$@"
