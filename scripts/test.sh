#!/usr/bin/env bash
# The test command: install, build, then run every test with ctest.
#   scripts/test.sh                  every tier (what CI runs)
#   scripts/test.sh --tier unit      one tier, or several: --tier unit,process
# Tiers (docs/testing.md): unit (in one process, seconds), process (real processes), e2e (a
# coordinator and workers running a job), tool (prometheus, chromium, kubectl or a Python venv),
# soak (long fault runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tiers=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tier) [ $# -ge 2 ] || { echo "test: --tier needs a value (unit, process, e2e, tool, soak)" >&2; exit 2; }
      tiers=$2; shift 2 ;;
    --tier=*) tiers=${1#--tier=}; shift ;;
    *) echo "test: unknown argument '$1' (usage: scripts/test.sh [--tier unit,process,e2e,tool,soak])" >&2
      exit 2 ;;
  esac
done
label=""
if [ -n "$tiers" ]; then
  for t in ${tiers//,/ }; do
    case "$t" in
      unit | process | e2e | tool | soak) ;;
      *) echo "test: --tier '$t' is not one of unit, process, e2e, tool, soak" >&2; exit 2 ;;
    esac
  done
  label="^(${tiers//,/|})\$"
fi
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
if [ -z "$tiers" ] || [[ ",$tiers," == *,tool,* ]]; then
  # The Hugging Face round-trip test's venv (pinned transformers, a test tool only; tests/hf/).
  bash "$root/scripts/hf-venv.sh" "$root/build/hf-venv"
  # The TensorBoard test's venv (pinned tensorboard, a test tool only; tests/tensorboard/).
  bash "$root/scripts/tensorboard-venv.sh" "$root/build/tensorboard-venv"
  # The trace test's venv (pinned HolisticTraceAnalysis, a test tool only; tests/trace/).
  bash "$root/scripts/trace-venv.sh" "$root/build/trace-venv"
fi
cd "$root/build"
# Two ctest workers: the multi-process tests start several ranks each.
if [ -n "$label" ]; then
  ctest --output-on-failure -j2 --timeout 900 -L "$label"
else
  ctest --output-on-failure -j2 --timeout 900
fi
