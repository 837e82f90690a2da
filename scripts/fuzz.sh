#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, no libtorch) in build-fuzz/ and
# runs each for SECONDS (default 60) on a copy of its seed corpus in fuzz/corpus/<target>/.
# Exits non-zero when any target crashes, printing the crashing input's path.
#   bash scripts/fuzz.sh [SECONDS]
# FUZZ_TARGETS="job_spec wire" limits the run to some targets; FUZZ_JOBS=N runs N at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_PER_TARGET=${1:-60}
TARGETS=(${FUZZ_TARGETS:-job_spec hf_config safetensors wire})
JOBS=${FUZZ_JOBS:-1}
BUILD=$ROOT/build-fuzz

export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=true
if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DLATCHKEY_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
ninja -C "$BUILD" -j"${FUZZ_BUILD_JOBS:-2}" "${TARGETS[@]/#/fuzz_}"

# Debian's protobuf, abseil and libstdc++ are not instrumented: container-overflow reports
# across that boundary are false positives.
export ASAN_OPTIONS=detect_container_overflow=0:detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

WORK=$(mktemp -d "${TMPDIR:-/tmp}/latchkey-fuzz.XXXXXX")
echo "fuzz: ${SECONDS_PER_TARGET}s per target, work dir $WORK"

run_target() {
  local t=$1 dir=$WORK/$1
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -r "$ROOT/fuzz/corpus/$t/." "$dir/corpus/"
  # -rss_limit_mb / -malloc_limit_mb: an input that makes a parser allocate > 2 GB is a finding.
  "$BUILD/fuzz/fuzz_$t" "$dir/corpus" -max_total_time="$SECONDS_PER_TARGET" \
    -artifact_prefix="$dir/artifacts/" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -max_len=65536 -timeout=10 -print_final_stats=1 >"$dir/log" 2>&1
}

failed=()
pids=()
names=()
for t in "${TARGETS[@]}"; do
  run_target "$t" &
  pids+=($!)
  names+=("$t")
  if [ "${#pids[@]}" -ge "$JOBS" ]; then
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}" || failed+=("${names[$i]}")
    done
    pids=()
    names=()
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${names[$i]}")
done

for t in "${TARGETS[@]}"; do
  log=$WORK/$t/log
  echo "== fuzz_$t: $(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1)"
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
done

status=0
for t in "${failed[@]}"; do
  status=1
  echo "fuzz: fuzz_$t FAILED; log $WORK/$t/log"
  tail -n 40 "$WORK/$t/log"
  for a in "$WORK/$t/artifacts"/*; do
    [ -e "$a" ] && echo "fuzz: crashing input: $a"
  done
done
if [ "$status" -eq 0 ]; then
  echo "fuzz: no crash in ${TARGETS[*]}"
  rm -rf "$WORK"
fi
exit "$status"
