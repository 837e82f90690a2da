#!/usr/bin/env bash
# The shm transport (worker/comm/shm: futexes, robust mutexes, ranks as threads) under
# ThreadSanitizer: the LATCHKEY_NO_TORCH build with LATCHKEY_TSAN, only shm_group_test and what
# it links, then a run of it. Exits non-zero on any report (halt_on_error) or test failure.
# (The ASan+UBSan build of scripts/sanitize.sh runs the same test.)
# Usage: scripts/tsan.sh [BUILD_DIR]   (default: build-tsan in the checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-tsan}
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLATCHKEY_NO_TORCH=ON -DLATCHKEY_TSAN=ON -DLATCHKEY_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target shm_group_test
built=$(date +%s)
status=0
"$build/worker/shm_group_test" || status=$?
end=$(date +%s)
echo "tsan: build $((built - start)) s, test $((end - built)) s"
[ "$status" -eq 0 ] || echo "tsan: failed (a test failed or ThreadSanitizer reported; see above)" >&2
exit "$status"
