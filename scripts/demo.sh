#!/usr/bin/env bash
# The main job: trains the demo GPTBigCode (examples/demo.json: MQA, TP 2, Gloo on CPU) on this
# repository's own source code turned into byte tokens, under a local coordinator with 2 worker
# processes, with a warmup + cosine learning rate schedule and, every 10 steps, an evaluation
# loss on held-out files (the tests' and benchmarks' C++, which the training corpus leaves out).
# Per-step JSONL lands in runs/demo/steps-{rank}.jsonl, the final weights in runs/demo/final,
# the coordinator's SQLite database and logs in runs/demo/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Installs what is missing and builds incrementally (a no-op when up to date; the first build
# takes about 12 minutes on 2 cores).
echo "demo: building (scripts/build.sh)"
bash "$root/scripts/build.sh"
worker="$root/build/worker/latchkey-worker"
run="$root/runs/demo"
mkdir -p "$run"
# A code model wants code: the repository's C++ sources as one byte-level corpus.
find "$root/common" "$root/worker" "$root/server" "$root/client" -name '*.cc' -o -name '*.h' 2>/dev/null \
  | sort | xargs cat > "$run/corpus.txt"
"$worker" tokenize "$run/corpus.txt" "$run/tokens.bin"
# Held out for the evaluation loss (latchkey.eval): C++ the training corpus does not contain,
# the tests' and benchmarks' sources.
find "$root/tests" "$root/bench" -name '*.cc' -o -name '*.h' 2>/dev/null \
  | sort | xargs cat > "$run/eval-corpus.txt"
"$worker" tokenize "$run/eval-corpus.txt" "$run/eval-tokens.bin"

# latchkey up: an embedded coordinator, one worker process per rank, live progress and a
# summary table. Ctrl-C stops everything it started.
exec "$root/build/client/latchkey" up --spec "$root/examples/demo.json" --run-dir "$run" "$@"
