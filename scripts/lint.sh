#!/usr/bin/env bash
# Source hygiene, run by CI before the tests: every C++ file is clang-formatted (the
# repository's .clang-format) and no source file is longer than 600 lines. Exit 1 names the
# offending files. Fix formatting with:  git ls-files '*.cc' '*.h' | xargs clang-format -i
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! command -v clang-format >/dev/null; then
  echo "lint: clang-format not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
status=0
unformatted=()
long=()
while IFS= read -r f; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then unformatted+=("$f"); fi
done < <(git ls-files '*.cc' '*.h')
while IFS= read -r f; do
  if [ "$(wc -l < "$f")" -gt 600 ]; then long+=("$f ($(wc -l < "$f") lines)"); fi
done < <(git ls-files '*.cc' '*.h' '*.py' '*.sh' '*.proto')
if [ "${#unformatted[@]}" -gt 0 ]; then
  echo "lint: ${#unformatted[@]} file(s) differ from clang-format:" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  status=1
fi
if [ "${#long[@]}" -gt 0 ]; then
  echo "lint: source files over 600 lines:" >&2
  printf '  %s\n' "${long[@]}" >&2
  status=1
fi
[ "$status" -eq 0 ] && echo "lint: $(git ls-files '*.cc' '*.h' | wc -l) C++ files formatted, none over 600 lines"
exit "$status"
