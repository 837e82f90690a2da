#!/usr/bin/env bash
# Installs the Debian packages (scripts/setup.sh), configures and builds into build/.
# Usage: scripts/build.sh [cmake -D options...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
jobs=$(nproc)
cmake -S "$root" -B "$root/build" -G Ninja "$@"
cmake --build "$root/build" -j"$jobs"
