#!/bin/sh
# Runs in the runtime stages as root: installs the packages listed in
# /opt/latchkey/runtime-packages.txt (the owners of the libraries the binaries in
# /opt/latchkey/bin load) and the BLAS, then drops apt's lists. --no-blas: without the BLAS (the
# GPU image: PyTorch's wheel brings its own, linked in).
set -eu
# libopenblas0-pthread: the BLAS Debian's libtorch's matmuls run on (it replaces libblas.so.3; no
# binary links it by name, so ldd cannot find it).
blas=libopenblas0-pthread
if [ "${1:-}" = "--no-blas" ]; then blas=""; fi
apt-get update -q
# shellcheck disable=SC2046,SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  $(cat /opt/latchkey/runtime-packages.txt) $blas
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
for bin in /opt/latchkey/bin/*; do
  if ldd "$bin" | grep -q 'not found'; then
    echo "install-runtime: $bin misses libraries:" >&2
    ldd "$bin" | grep 'not found' >&2
    exit 1
  fi
done
