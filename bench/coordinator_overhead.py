#!/usr/bin/python3
"""Coordinator overhead: the same job standalone and under the coordinator, interleaved.

    bench/coordinator_overhead.py [--build build] [--repeats 5] [--steps 30]

Each repeat runs the job twice, standalone (2 ranks, torchrun-style env) and under a local
coordinator (`latchkey up`), alternating which goes first. The step time of a run is the median
over its rank-0 steps (without the first, warm-up step) of `step_seconds + latch_wait_seconds`:
the window itself plus any wait for its latch, so the coordinator's whole cost per step counts. Prints every pair, then the median
ratio (coordinator / standalone) with its spread (min..max over repeats).
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile

SPEC = {
    "model": {"model_type": "gpt_bigcode", "n_layer": 4, "n_embd": 128, "n_head": 8,
              "vocab_size": 256, "n_positions": 128, "multi_query": True},
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
    "tensor_parallel": {"autotp_size": 2},
    "latchkey": {"seq_len": 128, "steps": 30, "seed": 1, "world_size": 2,
                 "kv_reduce": "coalesced", "data": {"synthetic": {"seed": 1}}},
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_step(jsonl):
    rows = [json.loads(l) for l in open(jsonl) if l.strip()]
    return statistics.median(r["step_seconds"] + r.get("latch_wait_seconds", 0.0)
                             for r in rows[1:])


def standalone(build, spec_path, out):
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [f"{build}/worker/latchkey-worker", "--standalone", "--spec", spec_path,
             "--metrics-jsonl", f"{out}/steps-{{rank}}.jsonl", "--quiet"], env=env))
    if any(p.wait(timeout=600) != 0 for p in procs):
        sys.exit("standalone run failed")
    return median_step(f"{out}/steps-0.jsonl")


def coordinated(build, spec_path, out):
    r = subprocess.run([f"{build}/client/latchkey", "up", "--spec", spec_path, "--run-dir", out],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    if r.returncode != 0:
        sys.exit(f"latchkey up failed ({r.returncode}); see {out}")
    return median_step(f"{out}/steps-0.jsonl")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="latchkey-overhead-")
    spec = dict(SPEC)
    spec["latchkey"] = dict(SPEC["latchkey"], steps=a.steps)
    spec_path = f"{work}/spec.json"
    json.dump(spec, open(spec_path, "w"))
    print(f"job: 4 layers, n_embd 128, TP 2, GAS 4, MB 4, seq 128, {a.steps} steps; "
          f"{a.repeats} interleaved repeats\n")
    print("| repeat | standalone step s | coordinator step s | ratio |")
    print("|---|---|---|---|")
    ratios = []
    for i in range(a.repeats):
        runs = {}
        order = ["standalone", "coordinator"] if i % 2 == 0 else ["coordinator", "standalone"]
        for kind in order:
            out = f"{work}/{i}-{kind}"
            os.makedirs(out, exist_ok=True)
            fn = standalone if kind == "standalone" else coordinated
            runs[kind] = fn(a.build, spec_path, out)
        ratio = runs["coordinator"] / runs["standalone"]
        ratios.append(ratio)
        print(f"| {i} | {runs['standalone']:.4f} | {runs['coordinator']:.4f} | {ratio:.4f} |",
              flush=True)
    print(f"\nmedian ratio coordinator/standalone: {statistics.median(ratios):.4f} "
          f"(spread {min(ratios):.4f} .. {max(ratios):.4f}; "
          f"overhead {100 * (statistics.median(ratios) - 1):+.2f}%)")


if __name__ == "__main__":
    main()
