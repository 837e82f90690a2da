#!/usr/bin/env bash
# Installs the Debian packages (scripts/setup.sh), configures and builds into build/.
# Usage: scripts/build.sh [cmake -D options...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
jobs=$(nproc)
# ccache: paths relative to the checkout, so a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
cmake -S "$root" -B "$root/build" -G Ninja "$@"
cmake --build "$root/build" -j"$jobs"
