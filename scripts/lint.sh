#!/usr/bin/env bash
# Source hygiene, run by CI before the tests: every C++ file is clang-formatted (the
# repository's .clang-format), no source file is longer than 600 lines, and the layering rules
# below hold. Exit 1 names the offending files.
# Fix formatting with:  git ls-files '*.cc' '*.h' | xargs clang-format -i
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
# Architecture rules (docs/architecture.md, "Layering"): checked here so they stay true.
# Decisions are made on Status codes and details (common/error_info.h), never on message text.
# No StrContains at all outside tests, and no other substring test on a message().
msg_tests=$(git grep -nE 'StrContains\(|(StartsWith|EndsWith)\([^;]*message\(\)|message\(\)[^;]*\.(find|rfind|compare)\(' \
  -- '*.cc' '*.h' ':!tests/' ':!*_test.cc' ':!third_party/' || true)
# The training code sees checkpoints only through the state view.
train_ckpt=$(git grep -nE '#include "worker/checkpoint/' -- 'worker/train/' |
  grep -v '#include "worker/checkpoint/training_state.h"' || true)
# Collectives know nothing of checkpoints, training or the runner.
comm_up=$(git grep -nE '#include "worker/(checkpoint|train|runner)/' -- 'worker/comm/' || true)
# Programs are started through common/subprocess.h with an argv, never through a shell.
shell=$(git grep -n 'std::system(' -- '*.cc' '*.h' ':!third_party/' || true)
# The folders' edges (docs/architecture.md, "Layering"); tests may reach further.
common_up=$(git grep -nE '#include "(worker|server|client|proto)/' -- 'common/' ':!*_test.cc' || true)
proto_up=$(git grep -nE '#include "(worker|server|client)/' -- 'proto/' ':!*_test.cc' || true)
worker_up=$(git grep -nE '#include "(server|client)/' -- 'worker/' ':!*_test.cc' || true)
server_out=$(git grep -nE '#include "(worker|client)/' -- 'server/' ':!*_test.cc' || true)
# The CLI reads checkpoints through the torch-free format library only.
client_worker=$(git grep -nE '#include "worker/' -- 'client/' ':!*_test.cc' |
  grep -vE '#include "worker/checkpoint/(checkpoint_tools|train_checkpoint|checkpoint_root|safetensors|hf_checkpoint|files|logical_layout|pieces)\.h"' || true)
# Metrics observe reports, not the engine.
metrics_train=$(git grep -nE '#include "worker/train/' -- 'worker/metrics/' || true)
# <regex> does not build under scripts/sanitize.sh (GCC 12's -Werror=maybe-uninitialized inside
# it with -fsanitize): none in what that build compiles.
sanitized_regex=$(git grep -n '#include <regex>' -- common/ proto/ server/ client/ worker/ \
  tests/support/ || true)
for rule in msg_tests train_ckpt comm_up shell common_up proto_up worker_up server_out \
  client_worker metrics_train sanitized_regex; do
  found=${!rule}
  if [ -n "$found" ]; then
    case $rule in
      msg_tests) echo "lint: a decision on status message text (decide on codes and ErrorInfo details):" >&2 ;;
      train_ckpt) echo "lint: worker/train/ includes worker/checkpoint/ beyond training_state.h:" >&2 ;;
      comm_up) echo "lint: worker/comm/ includes worker/checkpoint/, worker/train/ or worker/runner/:" >&2 ;;
      shell) echo "lint: std::system( (start programs through common/subprocess.h with an argv):" >&2 ;;
      common_up) echo "lint: common/ includes worker/, server/, client/ or proto/:" >&2 ;;
      proto_up) echo "lint: proto/ includes worker/, server/ or client/:" >&2 ;;
      worker_up) echo "lint: worker/ includes server/ or client/:" >&2 ;;
      server_out) echo "lint: server/ includes worker/ or client/:" >&2 ;;
      client_worker) echo "lint: client/ includes worker/ beyond the torch-free checkpoint format:" >&2 ;;
      metrics_train) echo "lint: worker/metrics/ includes worker/train/:" >&2 ;;
      sanitized_regex) echo "lint: <regex> in code the sanitizer build compiles (scan by hand):" >&2 ;;
    esac
    printf '%s\n' "$found" | sed 's/^/  /' >&2
    status=1
  fi
done
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
[ "$status" -eq 0 ] && echo "lint: $(git ls-files '*.cc' '*.h' | wc -l) C++ files formatted, none over 600 lines, layering rules hold"
exit "$status"
