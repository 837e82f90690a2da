#!/usr/bin/env bash
# The ASan+UBSan build of the parts without libtorch (common/, proto/, server/, client/ and the
# torch-free worker pieces they link: checkpoint files, the worker session), and a run of every
# test registered in that configuration (LATCHKEY_NO_TORCH: common_test, checkpoint_test,
# server_test, the coordinator suite, worker_session_test). Exits non-zero on any finding: a
# sanitizer report fails its test (halt_on_error, -fno-sanitize-recover).
# Usage: scripts/sanitize.sh [BUILD_DIR]   (default: build-asan in the checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-asan}
jobs=$(nproc)
# Debian's protobuf, gRPC and abseil are not instrumented: their inline container code runs
# half in instrumented and half in plain objects, which gives false container-overflow reports.
export ASAN_OPTIONS=detect_container_overflow=0:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Leaks stay on; only those inside Debian's c-ares (gRPC's resolver) are suppressed.
export LSAN_OPTIONS=suppressions=$root/scripts/lsan-suppressions.txt
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLATCHKEY_NO_TORCH=ON -DLATCHKEY_SANITIZE=ON -DLATCHKEY_BUILD_BENCH=OFF >/dev/null
# gtest_discover_tests runs the instrumented binaries at build time, under the options above.
cmake --build "$build" -j"$jobs"
built=$(date +%s)
cd "$build"
status=0
ctest --output-on-failure -j2 --timeout 900 || status=$?
end=$(date +%s)
echo "sanitize: build $((built - start)) s, tests $((end - built)) s"
if [ "$status" -ne 0 ]; then
  echo "sanitize: failed (a test failed or a sanitizer reported; see above)" >&2
fi
exit "$status"
