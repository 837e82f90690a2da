#!/usr/bin/env bash
# Creates or updates the Python venv of the TensorBoard test (tests/tensorboard/): Debian's
# interpreter, no system site packages (the HF venv's torch 1.13 and tensorboard want different
# numpy), the exact pins of tests/tensorboard/requirements.txt (scripts/venv.sh).
# Usage: scripts/tensorboard-venv.sh [VENV_DIR]   (default build/tensorboard-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exec bash "$root/scripts/venv.sh" tensorboard-venv "$root/tests/tensorboard/requirements.txt" \
  "${1:-$root/build/tensorboard-venv}" own "import numpy, tensorboard, google.protobuf
from tensorboard.backend.event_processing import event_accumulator
print('tensorboard-venv: tensorboard', tensorboard.__version__, 'numpy', numpy.__version__,
      'protobuf', google.protobuf.__version__)"
