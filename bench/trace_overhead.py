#!/usr/bin/python3
"""Trace overhead: the same job with the span ring on and off, interleaved.

    bench/trace_overhead.py [--build build] [--repeats 5] [--steps 30] [--check]

Each repeat runs one standalone job twice (2 ranks, TP 2, torchrun-style env, the small model of
bench_util.TP2_SPEC): once recording (the default ring, --trace-jsonl
written as the run ends) and once with --trace-spans 0 (no timeline), alternating which goes
first. A run's step time is the median over steps 1.. of rank 0's step_seconds (the window:
micro-batches, boundary, optimizer; every span of a step is recorded inside it). Prints every
pair, the median ratio traced / untraced with its spread (min..max over repeats), the spans a
step records, and the size of the trace files. The goal is an overhead of at most 1%; --check
exits 1 when the median ratio is above 1.02 (these machines' noise is about 1%).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_util import TP2_SPEC, free_port


def run(build, spec_path, out, traced):
    os.makedirs(out, exist_ok=True)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        trace = (["--trace-jsonl", f"{out}/trace-{{rank}}.jsonl"] if traced
                 else ["--trace-spans", "0"])
        procs.append(subprocess.Popen(
            [f"{build}/worker/latchkey-worker", "--standalone", "--spec", spec_path,
             "--metrics-jsonl", f"{out}/steps-{{rank}}.jsonl", "--quiet"] + trace,
            env=env, stdout=subprocess.DEVNULL, stderr=open(f"{out}/worker-{rank}.log", "w")))
    codes = [p.wait(timeout=900) for p in procs]
    if any(codes):
        sys.exit(f"run failed {codes}; see {out}")
    rows = [json.loads(l) for l in open(f"{out}/steps-0.jsonl") if l.strip()]
    step = statistics.median(r["step_seconds"] for r in rows[1:])
    spans = None
    size = 0
    if traced:
        lines = open(f"{out}/trace-0.jsonl").read().splitlines()
        spans = sum(1 for l in lines[1:] if json.loads(l).get("step", -1) == len(rows) // 2)
        size = sum(os.path.getsize(f"{out}/trace-{r}.jsonl") for r in range(2))
    return step, spans, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="latchkey-trace-overhead-")
    spec = json.loads(json.dumps(TP2_SPEC))
    spec["latchkey"]["steps"] = a.steps
    spec_path = f"{work}/spec.json"
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    print(f"Trace overhead: standalone TP 2 on 2 ranks, {a.steps} steps, GAS 4, "
          f"{os.cpu_count()} cores; rank 0's median step_seconds over steps 1..")
    print("| repeat | untraced step s | traced step s | ratio traced/untraced |")
    print("|---|---|---|---|")
    ratios, offs, ons = [], [], []
    spans = size = None
    for i in range(a.repeats):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {}
        for traced in order:
            got[traced] = run(a.build, spec_path, f"{work}/r{i}-{'on' if traced else 'off'}",
                              traced)
        off, on = got[False][0], got[True][0]
        spans, size = got[True][1], got[True][2]
        ratios.append(on / off)
        offs.append(off)
        ons.append(on)
        print(f"| {i} | {off:.4f} | {on:.4f} | {on / off:.4f} |")
    med = statistics.median(ratios)
    print(f"median: untraced {statistics.median(offs):.4f} s, traced "
          f"{statistics.median(ons):.4f} s, ratio {med:.4f} ({min(ratios):.4f} .. "
          f"{max(ratios):.4f})")
    print(f"spans per step (rank 0): {spans}; trace files of a run: {size} bytes "
          f"({size / 2 / a.steps:.0f} bytes per rank-step)")
    if a.check and med > 1.02:
        print(f"PROBLEM: tracing costs {100 * (med - 1):.1f}% of the step (> 2%)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
