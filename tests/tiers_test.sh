#!/bin/sh
# Every ctest entry of this build carries exactly one tier label (cmake/latchkey_tests.cmake):
# none is left out of `scripts/test.sh --tier ...`, none runs in two tiers.
# Usage: tiers_test.sh BUILD_DIR
set -eu
cd "$1"
tiers="unit process e2e tool soak"
count() { ctest -N "$@" | sed -n 's/^Total Tests: //p'; }
total=$(count)
untiered=$(ctest -N -LE '^(unit|process|e2e|tool|soak)$' | grep -E '^ *Test +#' || true)
if [ -n "$untiered" ]; then
  echo "tests without a tier label (unit, process, e2e, tool or soak):"
  echo "$untiered"
  exit 1
fi
sum=0
for t in $tiers; do
  n=$(count -L "^$t\$")
  echo "$t: $n"
  sum=$((sum + n))
done
echo "total: $total"
if [ "$sum" -ne "$total" ]; then
  echo "the tiers hold $sum entries for $total tests: some test carries two tiers"
  exit 1
fi
