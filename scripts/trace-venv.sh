#!/usr/bin/env bash
# Creates or updates the Python venv of the trace test (tests/trace/): Debian's interpreter, no
# system site packages, the exact pins of tests/trace/requirements.txt (HolisticTraceAnalysis and
# its dependencies; scripts/venv.sh).
# Usage: scripts/trace-venv.sh [VENV_DIR]   (default build/trace-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exec bash "$root/scripts/venv.sh" trace-venv "$root/tests/trace/requirements.txt" \
  "${1:-$root/build/trace-venv}" own "import importlib.metadata, pandas
from hta.common.trace import parse_trace_file
print('trace-venv: HolisticTraceAnalysis', importlib.metadata.version('HolisticTraceAnalysis'),
      'pandas', pandas.__version__)"
