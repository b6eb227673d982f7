# Source on an offline GPU host, from the repo root: `source scripts/gpu_env.sh`.
# Needs .whl/ made here by ../shared/tools/make_gpu_wheelhouse.sh (SGLang 0.5.17 for a host that
# already has torch 2.11, triton 3.6, Python 3.12). Installs SGLang's site tree and this package
# (so SGLang finds our plugin entry point) into /tmp/site, compiles the tree's bytecode once as pip does when it
# installs a wheel (the wheelhouse ships none, and the hosts' Python writes none: without it every SGLang process
# compiles its imports from source), and sets the environment every run needs: puts /tmp/site
# first on PYTHONPATH (keeping what it held) and CUDA's bin on PATH, and exports the SGLang, NCCL/NVSHMEM (no NVLink
# multicast) and Hugging Face (offline) settings these runs use. Run rather than sourced, it changes nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in -h|--help) sed -n '/^[^#]/q; s/^# \{0,1\}//p' "$0"; exit 0;; esac
  echo "gpu_env.sh: source it (source scripts/gpu_env.sh): run as a command it cannot set the caller's environment" >&2
  exit 2
fi
mkdir -p /tmp/site
if [ ! -f /tmp/site/.sglang_unpacked ]; then
  tar -xJf .whl/sglang-site-cp312.tar.xz -C /tmp/site && (python3 -m compileall -q -j 0 /tmp/site >/dev/null || true) \
    && touch /tmp/site/.sglang_unpacked
fi
python3 -m pip install -q --no-deps --no-index --no-build-isolation --upgrade --target /tmp/site . >/dev/null
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=/usr/local/cuda/bin:$PATH SGLANG_IS_FLASHINFER_AVAILABLE=false \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
