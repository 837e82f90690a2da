#!/usr/bin/env bash
# Creates or updates the Python venv of the Hugging Face round-trip test (tests/hf/) and of
# scripts/prepare-data: Debian's interpreter, --system-site-packages (Debian's python3-torch
# stays visible), the exact pins of tests/hf/requirements.txt (scripts/venv.sh).
# Usage: scripts/hf-venv.sh [VENV_DIR]   (default build/hf-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exec bash "$root/scripts/venv.sh" hf-venv "$root/tests/hf/requirements.txt" \
  "${1:-$root/build/hf-venv}" system "import torch, transformers, safetensors
from transformers import GPTBigCodeForCausalLM
print('hf-venv: torch', torch.__version__, 'transformers', transformers.__version__,
      'safetensors', safetensors.__version__)"
