#!/usr/bin/env bash
# The main job, standalone: trains the demo GPTBigCode (examples/demo.json: MQA, TP 2, Gloo on
# CPU) on this repository's own source code turned into byte tokens, with 2 local ranks.
# Per-step JSONL lands in runs/demo/steps-{rank}.jsonl and the final weights in runs/demo/final.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$root/build/worker/latchkey-worker" ]; then
  bash "$root/scripts/build.sh"
fi
worker="$root/build/worker/latchkey-worker"
run="$root/runs/demo"
mkdir -p "$run"
# A code model wants code: the repository's C++ sources as one byte-level corpus.
find "$root/common" "$root/worker" "$root/server" "$root/client" -name '*.cc' -o -name '*.h' 2>/dev/null \
  | sort | xargs cat > "$run/corpus.txt"
"$worker" tokenize "$run/corpus.txt" "$run/tokens.bin"

world=2
port=$(( 29500 + RANDOM % 2000 ))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup INT TERM
for rank in $(seq 0 $((world - 1))); do
  quiet=""
  [ "$rank" -ne 0 ] && quiet="--quiet"
  RANK=$rank WORLD_SIZE=$world LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$worker" --standalone --spec "$root/examples/demo.json" \
    --metrics-jsonl "$run/steps-{rank}.jsonl" --save "$run/final" $quiet &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
trap - INT TERM
if [ $status -ne 0 ]; then
  echo "demo: a rank failed (see messages above)" >&2
  exit 1
fi
/usr/bin/python3 - "$run/steps-0.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
times = [r["step_seconds"] for r in rows]
calls = rows[-1]["collective_calls"]
print()
print("summary (rank 0)")
print(f"  steps                      {len(rows)}")
print(f"  loss first -> final        {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}")
print(f"  K/V all-reduces per step   {rows[-1]['kv_allreduce_calls']} ({rows[-1]['kv_mode']})")
print(f"  collectives per step       " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
print(f"  median step time           {statistics.median(times):.3f} s")
print(f"  tokens per second          {rows[-1]['tokens'] / statistics.median(times):.0f}")
PY
echo "weights: $run/final (HF GPTBigCode checkpoint); per-step metrics: $run/steps-*.jsonl"
