#!/usr/bin/env bash
# The main job: trains the demo GPTBigCode (examples/demo.json: MQA, TP 2, Gloo on CPU) on this
# repository's own source code, tokenized with a byte-level BPE trained on those sources and
# written as a Megatron indexed dataset (scripts/prepare-data), under a local coordinator with 2
# worker processes, with a warmup + cosine learning rate schedule and, every 10 steps, an
# evaluation loss on the dataset's validation split: C++ of the tests and benchmarks, which the
# training split leaves out. Per-step JSONL lands in runs/demo/steps-{rank}.jsonl, TensorBoard
# event files in runs/demo/tensorboard (`tensorboard --logdir runs/demo/tensorboard`), the final
# weights in runs/demo/final, the coordinator's SQLite database and logs in runs/demo/.
# The tokenizer and dataset are cached in runs/demo/data/, keyed by the SHA-256 of their inputs:
# a second run with unchanged sources does not tokenize again.
# Environment: LATCHKEY_DEMO_SPEC (default examples/demo.json), LATCHKEY_DEMO_RUN_DIR (default
# runs/demo; the spec's latchkey.data.path_prefix must be RUN/data/corpus), LATCHKEY_DEMO_BUILD=0
# (use the binaries already in LATCHKEY_BUILD_DIR, default build/, instead of scripts/build.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
spec=${LATCHKEY_DEMO_SPEC:-$root/examples/demo.json}
run=${LATCHKEY_DEMO_RUN_DIR:-$root/runs/demo}
build=${LATCHKEY_BUILD_DIR:-$root/build}
start=$EPOCHREALTIME
since() { LC_ALL=C awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }

t=$EPOCHREALTIME
if [ "${LATCHKEY_DEMO_BUILD:-1}" != 0 ]; then
  # Installs what is missing and builds incrementally (a no-op when up to date; the first build
  # takes about 12 minutes on 2 cores).
  echo "demo: building (scripts/build.sh)"
  bash "$root/scripts/build.sh"
fi
build_time=$(since "$t")
echo "demo: build ready ($build_time)"
mkdir -p "$run/data"

# A code model wants code. The training documents are the C++ sources of common/, worker/,
# server/ and client/ (one document per file); then as many of the tests' and benchmarks'
# sources as make the spec's validation share exactly those files (Megatron splits by document,
# in order: [round(a*N), round(b*N)) for the split's running sums a, b).
split_counts() {  # TRAIN_FILES HELD_OUT_FILES -> "t h": the files of each that are used
  python3 - "$spec" "$1" "$2" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
shares = [float(x) for x in spec["latchkey"]["data"]["split"].replace("/", ",").split(",")]
shares += [0.0] * (3 - len(shares))
train = shares[0] / sum(shares)
T, H = int(sys.argv[2]), int(sys.argv[3])
best = None
for t in range(T, 0, -1):
    for h in range(min(H, 10 * t), 0, -1):
        if round(train * (t + h)) == t and (best is None or t + h > sum(best)):
            best = (t, h)
    if best is not None and best[0] == t:
        break
if best is None:
    sys.exit("demo: no document counts fit latchkey.data.split %r" % spec["latchkey"]["data"]["split"])
print(*best)
PY
}
mapfile -t train_files < <(find "$root/common" "$root/worker" "$root/server" "$root/client" \
  \( -name '*.cc' -o -name '*.h' \) | sort)
mapfile -t held_out < <(find "$root/tests" "$root/bench" \( -name '*.cc' -o -name '*.h' \) | sort)
read -r nt nh < <(split_counts "${#train_files[@]}" "${#held_out[@]}")
inputs=("${train_files[@]:0:nt}" "${held_out[@]:0:nh}")
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"]["vocab_size"])' "$spec")
echo "demo: corpus: $nt training files + $nh held-out files (validation split), BPE vocab $vocab"

# The cache key: the tokenizer's size, the document list and contents, the tool and its pins.
t=$EPOCHREALTIME
key=$( { echo "vocab $vocab"; sha256sum "${inputs[@]}" | sed "s|  $root/|  |";
  sha256sum "$root/scripts/prepare_data.py" "$root/tests/hf/requirements.txt" | cut -d' ' -f1; } |
  sha256sum | cut -d' ' -f1)
prefix="$run/data/corpus"
if [ -f "$run/data/key" ] && [ "$(cat "$run/data/key")" = "$key" ] && [ -f "$prefix.bin" ] &&
  [ -f "$prefix.idx" ] && [ -f "$prefix.tokenizer.json" ]; then
  echo "demo: tokenizer and dataset cached in $run/data (key ${key:0:12}): not tokenizing again"
else
  echo "demo: training a byte-level BPE (vocab $vocab) and writing $prefix.bin/.idx (scripts/prepare-data)"
  rm -f "$run/data/key"
  "$root/scripts/prepare-data" --train-bpe "$vocab" --output-prefix "$prefix" "${inputs[@]}"
  echo "$key" > "$run/data/key"
fi
data_time=$(since "$t")
echo "demo: data ready ($data_time)"

# latchkey up: an embedded coordinator, one worker process per rank, live progress and a
# summary table. Ctrl-C stops everything it started.
t=$EPOCHREALTIME
rc=0
"$build/client/latchkey" up --spec "$spec" --run-dir "$run" "$@" || rc=$?
echo "demo: build $build_time, tokenizer + data $data_time, training $(since "$t"), total $(since "$start")"
exit "$rc"
