#!/usr/bin/env bash
# Creates or updates a pinned Python venv of a test tool: Debian's interpreter, the exact pins of
# a requirements file, then an import check. Idempotent: a venv whose stamp matches the
# requirements is left as it is. Used by scripts/hf-venv.sh and scripts/tensorboard-venv.sh.
# Usage: scripts/venv.sh NAME REQUIREMENTS VENV_DIR SITE CHECK_PYTHON
#   SITE: "system" (--system-site-packages: Debian's python3-torch stays visible) or "own"
#   CHECK_PYTHON: code run in the venv once installed (it imports the tools and prints versions)
set -euo pipefail
name=$1 req=$2 venv=$3 site=$4 check=$5
python=$(PATH=/usr/bin:/bin command -v python3)
stamp="$venv/.latchkey-requirements"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  echo "$name: $venv is up to date"
  exit 0
fi
echo "$name: installing $req into $venv"
if [ ! -x "$venv/bin/python" ]; then
  case "$site" in
    system) "$python" -m venv --system-site-packages "$venv" ;;
    own) "$python" -m venv "$venv" ;;
    *) echo "$name: SITE must be system or own, not '$site'" >&2; exit 2 ;;
  esac
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
"$venv/bin/python" -c "$check"
cp "$req" "$stamp"
