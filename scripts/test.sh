#!/usr/bin/env bash
# The test command: install, build, then run every test with ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# CI's one build is the LATCHKEY_CUDA=ON build (the NCCL backend over the CUDA toolkit's cudart
# and NCCL; tests that need a GPU skip themselves); where the toolkit or NCCL is absent, OFF.
cuda=OFF
cuda_root=${CUDA_HOME:-/usr/local/cuda}
if { command -v nvcc >/dev/null || [ -x "$cuda_root/bin/nvcc" ]; } &&
  { [ -e "$cuda_root/include/nccl.h" ] || [ -e /usr/include/nccl.h ] ||
    [ -e /usr/local/include/nccl.h ]; }; then
  cuda=ON
else
  echo "test: no CUDA toolkit with NCCL at $cuda_root: building with -DLATCHKEY_CUDA=OFF" >&2
fi
bash "$root/scripts/build.sh" -DLATCHKEY_CUDA=$cuda
# The Hugging Face round-trip test's venv (pinned transformers, a test tool only; tests/hf/).
bash "$root/scripts/hf-venv.sh" "$root/build/hf-venv"
# The TensorBoard test's venv (pinned tensorboard, a test tool only; tests/tensorboard/).
bash "$root/scripts/tensorboard-venv.sh" "$root/build/tensorboard-venv"
cd "$root/build"
# Two ctest workers: the multi-process tests start several ranks each.
ctest --output-on-failure -j2 --timeout 900
