#!/usr/bin/env bash
# Creates or updates the Python venv of the Hugging Face round-trip test (tests/hf/): Debian's
# interpreter, --system-site-packages (Debian's python3-torch stays visible), the exact pins of
# tests/hf/requirements.txt. Idempotent: a venv whose stamp matches the requirements is left as
# it is. Usage: scripts/hf-venv.sh [VENV_DIR]   (default build/hf-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/build/hf-venv}
req="$root/tests/hf/requirements.txt"
python=$(PATH=/usr/bin:/bin command -v python3)
stamp="$venv/.latchkey-requirements"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  echo "hf-venv: $venv is up to date"
  exit 0
fi
echo "hf-venv: installing $req into $venv"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
"$venv/bin/python" -c "import torch, transformers, safetensors
from transformers import GPTBigCodeForCausalLM
print('hf-venv: torch', torch.__version__, 'transformers', transformers.__version__,
      'safetensors', safetensors.__version__)"
cp "$req" "$stamp"
