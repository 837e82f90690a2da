#!/bin/bash
# Prints the Debian packages that own the shared libraries the given binaries load, one a line:
# the runtime stage installs exactly these (plus the BLAS, see install-runtime.sh). A library no
# package owns is named on stderr (exit 1). LATCHKEY_BUNDLED_LIBS: folders (colon-separated) of
# libraries the image ships itself (the GPU image's PyTorch and CUDA wheels): libraries there,
# as ldd names them or resolved, are left out.
set -euo pipefail
all=$(for bin in "$@"; do ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'; done | sort -u)
IFS=: read -r -a bundled <<<"${LATCHKEY_BUNDLED_LIBS:-}"
declare -A real
libs=""
for lib in $all; do
  resolved=$(readlink -f "$lib")
  skip=0
  for dir in "${bundled[@]}"; do
    case "$lib $resolved" in "$dir"/*|*" $dir"/*) skip=1 ;; esac
  done
  [ "$skip" = 1 ] && continue
  real[$lib]=$resolved
  libs+="$lib"$'\n'
done
[ -n "$libs" ] || exit 0
# One dpkg query for every path, as ldd names it and resolved (dpkg knows /lib or /usr/lib).
# shellcheck disable=SC2086
owned=$(dpkg -S $libs "${real[@]}" 2>/dev/null || true)
status=0
for lib in $libs; do
  if ! grep -q -e ": $lib\$" -e ": ${real[$lib]}\$" -e ": ${lib#/usr}\$" -e ": ${real[$lib]#/usr}\$" \
      <<<"$owned"; then
    # usrmerge: dpkg may record /lib/... for a library ldd finds under /usr/lib (or back).
    alt=$(dpkg -S "${lib#/usr}" "${real[$lib]#/usr}" 2>/dev/null || true)
    if [ -z "$alt" ]; then
      echo "list-runtime-packages: no package owns $lib" >&2
      status=1
    fi
    owned+=$'\n'"$alt"
  fi
done
cut -d: -f1 <<<"$owned" | grep -v '^$' | sort -u
exit "$status"
