#!/usr/bin/env bash
# Creates or updates the Python venv of the TensorBoard test (tests/tensorboard/): Debian's
# interpreter, no system site packages, the exact pins of tests/tensorboard/requirements.txt.
# Idempotent: a venv whose stamp matches the requirements is left as it is.
# Usage: scripts/tensorboard-venv.sh [VENV_DIR]   (default build/tensorboard-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/build/tensorboard-venv}
req="$root/tests/tensorboard/requirements.txt"
python=$(PATH=/usr/bin:/bin command -v python3)
stamp="$venv/.latchkey-requirements"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  echo "tensorboard-venv: $venv is up to date"
  exit 0
fi
echo "tensorboard-venv: installing $req into $venv"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
"$venv/bin/python" -c "import numpy, tensorboard, google.protobuf
from tensorboard.backend.event_processing import event_accumulator
print('tensorboard-venv: tensorboard', tensorboard.__version__, 'numpy', numpy.__version__,
      'protobuf', google.protobuf.__version__)"
cp "$req" "$stamp"
