#!/usr/bin/python3
"""Coordinator overhead: the same job standalone and under the coordinator, interleaved.

    bench/coordinator_overhead.py [--build build] [--repeats 5] [--steps 30]

Each repeat runs the job twice, standalone (2 ranks, torchrun-style env) and under a local
coordinator (`latchkey up`), alternating which goes first. Both runs write the per-step JSONL,
serve the worker metrics endpoint and save the final weights, so they differ only in where the
latches come from and in the step reports.

The step time is measured from outside the worker: this script watches rank 0's JSONL and
stamps the moment each line appears. Between two lines a rank runs everything its loop does
for one step: wait for the latch, the window, the JSONL and metrics writes, and (coordinated)
the ReportStep call. The step time of a run is the median of those intervals (the first line,
after the warm-up step, starts the first interval). For comparison the table also shows what
the worker measures inside, `step_seconds + latch_wait_seconds` (median over steps 1..), which
leaves out the writes and the ReportStep call, the median per step of the difference (what the
loop spends beyond the latch wait and the window), and each run's whole wall time (start-up,
join, rendezvous and the final save included).

Prints every pair, then per mode the median and spread (min..max) over repeats, and the median
ratio coordinator / standalone with its spread.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_util import TP2_SPEC, free_port, read_appended_lines

POLL_SECONDS = 0.002  # JSONL stamp resolution; steps take hundreds of milliseconds


class LineClock:
    """Stamps (time.monotonic) the appearance of each line of a file that is being appended."""

    def __init__(self, path):
        self.path = path
        self.stamps = []
        self._seen = 0

    def poll(self):
        now, complete, self._seen = read_appended_lines(self.path, self._seen)
        self.stamps.extend([now] * complete.count(b"\n"))


def watch(procs, jsonl, deadline_s=600):
    """Polls `jsonl` until every process ended; returns (line stamps, wall seconds, codes)."""
    clock = LineClock(jsonl)
    start = time.monotonic()
    while any(p.poll() is None for p in procs):
        if time.monotonic() - start > deadline_s:
            for p in procs:
                p.kill()
            sys.exit(f"run did not finish within {deadline_s} s")
        clock.poll()
        time.sleep(POLL_SECONDS)
    wall = time.monotonic() - start
    clock.poll()
    return clock.stamps, wall, [p.returncode for p in procs]


def measure(stamps, jsonl, steps):
    rows = [json.loads(line) for line in open(jsonl) if line.strip()]
    if len(rows) != steps or len(stamps) != steps:
        sys.exit(f"{jsonl}: {len(rows)} rows, {len(stamps)} stamped; want {steps}")
    intervals = [b - a for a, b in zip(stamps, stamps[1:])]
    inside = [r["step_seconds"] + r.get("latch_wait_seconds", 0.0) for r in rows[1:]]
    # Paired per step: what the loop spends outside the latch wait and the window (the previous
    # step's ReportStep, this step's writes), plus up to one poll of stamp jitter.
    extra = [i - w for i, w in zip(intervals, inside)]
    return {"step": statistics.median(intervals), "inside": statistics.median(inside),
            "extra": statistics.median(extra)}


def standalone(build, spec_path, out, steps):
    port = free_port()
    jsonl = f"{out}/steps-0.jsonl"
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [f"{build}/worker/latchkey-worker", "--standalone", "--spec", spec_path,
             "--metrics-jsonl", f"{out}/steps-{{rank}}.jsonl", "--metrics-host", "127.0.0.1",
             "--metrics-port", "0", "--save", f"{out}/final", "--quiet"],
            env=env, stdout=subprocess.DEVNULL, stderr=open(f"{out}/worker-{rank}.log", "w")))
    stamps, wall, codes = watch(procs, jsonl)
    if any(c != 0 for c in codes):
        sys.exit(f"standalone run failed {codes}; see {out}")
    return dict(measure(stamps, jsonl, steps), wall=wall)


def coordinated(build, spec_path, out, steps):
    jsonl = f"{out}/steps-0.jsonl"
    # `up` starts the workers with --metrics-port 0 and --save <run>/final, as above.
    proc = subprocess.Popen([f"{build}/client/latchkey", "up", "--spec", spec_path, "--run-dir",
                             out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stamps, wall, codes = watch([proc], jsonl)
    if codes[0] != 0:
        sys.exit(f"latchkey up failed ({codes[0]}); see {out}")
    return dict(measure(stamps, jsonl, steps), wall=wall)


def spread(values, fmt="{:.4f}"):
    return (fmt.format(statistics.median(values)) + " (" + fmt.format(min(values)) + " .. " +
            fmt.format(max(values)) + ")")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    if a.steps < 3:
        sys.exit("--steps must be at least 3 (a warm-up step and two intervals)")
    work = tempfile.mkdtemp(prefix="latchkey-overhead-")
    spec = dict(TP2_SPEC)
    spec["latchkey"] = dict(TP2_SPEC["latchkey"], steps=a.steps)
    spec_path = f"{work}/spec.json"
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    print(f"job: 4 layers, n_embd 128, TP 2, GAS 4, MB 4, seq 128, {a.steps} steps; "
          f"{a.repeats} interleaved repeats; step = median interval between rank 0's JSONL "
          f"lines (everything per step); inside = step_seconds + latch_wait_seconds\n")
    print("| repeat | standalone step s | coordinator step s | ratio "
          "| standalone inside s | coordinator inside s | standalone extra ms "
          "| coordinator extra ms | standalone run s | coordinator run s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    runs = {"standalone": [], "coordinator": []}
    ratios = []
    for i in range(a.repeats):
        got = {}
        order = ["standalone", "coordinator"] if i % 2 == 0 else ["coordinator", "standalone"]
        for kind in order:
            out = f"{work}/{i}-{kind}"
            os.makedirs(out, exist_ok=True)
            fn = standalone if kind == "standalone" else coordinated
            got[kind] = fn(a.build, spec_path, out, a.steps)
            runs[kind].append(got[kind])
        s, c = got["standalone"], got["coordinator"]
        ratios.append(c["step"] / s["step"])
        print(f"| {i} | {s['step']:.4f} | {c['step']:.4f} | {ratios[-1]:.4f} "
              f"| {s['inside']:.4f} | {c['inside']:.4f} | {1e3 * s['extra']:.2f} "
              f"| {1e3 * c['extra']:.2f} | {s['wall']:.2f} | {c['wall']:.2f} |",
              flush=True)
    print("\nmedian (min .. max) over repeats:")
    for kind in ("standalone", "coordinator"):
        r = runs[kind]
        print(f"  {kind:<12} step {spread([x['step'] for x in r])} s, "
              f"inside {spread([x['inside'] for x in r])} s, "
              f"extra {spread([1e3 * x['extra'] for x in r], '{:.2f}')} ms, "
              f"run {spread([x['wall'] for x in r], '{:.2f}')} s")
    m = statistics.median(ratios)
    print(f"ratio coordinator/standalone (step): {m:.4f} "
          f"(spread {min(ratios):.4f} .. {max(ratios):.4f}; overhead {100 * (m - 1):+.2f}%)")


if __name__ == "__main__":
    main()
