#!/usr/bin/env bash
# Fetches what the core-only build needs on a machine without Debian's C++ libraries and without
# network (a GPU machine with a pip CUDA PyTorch: docs/gpu.md), into .deps/ (ignored by git), to
# be carried there with the working tree. Run it here, on Debian 12 with network:
#   .deps/abseil-cpp/   abseil 20240722.0: Debian's source tarball, SHA-256 pinned below; CMake
#                       builds the parts the core links when no installed abseil is found
#   .deps/root/usr/     OpenSSL 3 headers and libcrypto (Debian 12's libssl-dev and libssl3,
#                       verified by apt); CMake uses them when the machine has no OpenSSL headers
#   .deps/MANIFEST      what was fetched, with SHA-256
# Installed packages always win: on a machine that has them, .deps/ is not used.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
absl_version=20240722.0
absl_url="http://deb.debian.org/debian/pool/main/a/abseil/abseil_${absl_version}.orig.tar.gz"
absl_sha256=df6d1f5ef540725f3851201176a60486aab332410788465c9877910bb471c34a

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$deps"

echo "gpu-deps: abseil $absl_version from $absl_url"
curl -sSf --retry 3 --max-time 120 -o "$tmp/absl.tar.gz" "$absl_url"
got=$(sha256sum "$tmp/absl.tar.gz" | cut -d' ' -f1)
if [ "$got" != "$absl_sha256" ]; then
  echo "gpu-deps: abseil tarball SHA-256 is $got, expected $absl_sha256: refusing it" >&2
  exit 1
fi
rm -rf "$deps/abseil-cpp"
mkdir -p "$deps/abseil-cpp"
# The library and its CMake files only (no tests' data, CI files or docs).
tar -xzf "$tmp/absl.tar.gz" -C "$deps/abseil-cpp" --strip-components=1 \
  "abseil-$absl_version/CMakeLists.txt" "abseil-$absl_version/CMake" \
  "abseil-$absl_version/absl" "abseil-$absl_version/LICENSE"
find "$deps/abseil-cpp/absl" \( -name '*_test.cc' -o -name '*_benchmark.cc' -o -name testdata \) \
  -prune -exec rm -rf {} +

echo "gpu-deps: libssl-dev and libssl3 (apt-get download)"
(cd "$tmp" && apt-get download libssl-dev libssl3 >/dev/null 2>&1) || {
  echo "gpu-deps: apt-get download libssl-dev libssl3 failed (is this Debian with network?)" >&2
  exit 1
}
rm -rf "$deps/root"
for deb in "$tmp"/*.deb; do
  dpkg-deb -x "$deb" "$deps/root"
done
# The headers and the shared libraries only (no static libraries, engines or documentation).
find "$deps/root" -mindepth 1 -maxdepth 2 ! -path "$deps/root/usr" ! -path "$deps/root/usr/include" \
  ! -path "$deps/root/usr/lib" -exec rm -rf {} +
find "$deps/root/usr/lib" -mindepth 2 -maxdepth 2 ! -name 'lib*.so*' -exec rm -rf {} +
test -f "$deps/root/usr/include/openssl/sha.h"
test -e "$deps/root/usr/lib/x86_64-linux-gnu/libcrypto.so"

{
  echo "abseil $absl_version $absl_sha256 $absl_url"
  (cd "$tmp" && sha256sum ./*.deb | sed 's|\./||')
} >"$deps/MANIFEST"
echo "gpu-deps: $(du -sh "$deps" | cut -f1) in $deps:"
cat "$deps/MANIFEST"
