#!/usr/bin/env bash
# The test command: install, build, then run every test with ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/build.sh"
# The Hugging Face round-trip test's venv (pinned transformers, a test tool only; tests/hf/).
bash "$root/scripts/hf-venv.sh" "$root/build/hf-venv"
cd "$root/build"
# Two ctest workers: the multi-process tests start several ranks each.
ctest --output-on-failure -j2 --timeout 900
