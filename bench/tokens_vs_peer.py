#!/usr/bin/python3
"""End-to-end tokens/s: latchkey against the plain PyTorch peer, and latchkey's collective share.

    /usr/bin/python3 bench/tokens_vs_peer.py [--presets P1,P2] [--repeats 3] [--steps 3]
        [--backends auto] [--worker build/worker/latchkey-worker] [--quick]

For each preset (P1: 24 layers, n_embd 256, 8 heads, seq 128, MB 1, GAS 32; P2: 8 layers,
n_embd 1024, 16 heads, seq 256, MB 2, GAS 4; both TP 2, MQA, vocab 256, AdamW, clipping 1.0,
the synthetic data source, coalesced K/V), each repeat runs latchkey (`latchkey-worker
--standalone`, one process per rank, torchrun-style env, once per --backends value) and the
peer (bench/peer/gpt_bigcode_tp.py), in an order that alternates from repeat to repeat, so
machine noise hits both sides. Each run does --steps windows; the first is warm-up and not
counted. Step time is each side's own rank-0 measure: latchkey's JSONL `step_seconds`, the
peer's `step_seconds` (the same span: every micro-batch's forward and backward, the K/V
reduction, the norm, clipping and the optimizer step). Both use cores / ranks threads per rank.

Tables (medians over every measured step of every repeat, with the min-max spread):
  1. tokens/s per side, and the ratio latchkey / peer (per repeat: median (min-max));
  2. the share of latchkey's step time spent in collectives: the worker's
     `latchkey_collective_seconds` histogram sums (every op and group) over its
     `latchkey_step_seconds` sum, from each rank's metrics endpoint, taken after the warm-up
     step and after the last one (the difference: measured steps only);
  3. (sanity) the loss of each step on both sides: the peer starts from the same weights and
     reads the same samples, so the trajectories agree closely.
--quick: a 2-layer model, 2 steps, 1 repeat (a smoke run of the whole path).
"""

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.path.join(HERE, "peer", "gpt_bigcode_tp.py")

PRESETS = {
    "P1": dict(layers=24, embd=256, heads=8, seq=128, mb=1, gas=32),
    "P2": dict(layers=8, embd=1024, heads=16, seq=256, mb=2, gas=4),
    "quick": dict(layers=2, embd=64, heads=4, seq=32, mb=1, gas=4),
}
TP = 2


def spec_json(p, steps, backend):
    return {
        "model": {"model_type": "gpt_bigcode", "n_layer": p["layers"], "n_embd": p["embd"],
                  "n_head": p["heads"], "vocab_size": 256, "n_positions": p["seq"],
                  "multi_query": True},
        "train_micro_batch_size_per_gpu": p["mb"],
        "gradient_accumulation_steps": p["gas"],
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}},
        "tensor_parallel": {"autotp_size": TP},
        "latchkey": {"seq_len": p["seq"], "steps": steps, "seed": 1, "world_size": TP,
                     "kv_reduce": "coalesced", "backend": backend,
                     "data": {"synthetic": {"seed": 1}}},
    }


def scrape(port):
    """(sum of latchkey_collective_seconds sums, of their counts, latchkey_step_seconds_sum)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    coll = calls = step = 0.0
    for line in text.splitlines():
        m = re.match(r"^(latchkey_\w+?)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if not m:
            continue
        name, value = m.group(1), float(m.group(3))
        if name == "latchkey_collective_seconds_sum":
            coll += value
        elif name == "latchkey_collective_seconds_count":
            calls += value
        elif name == "latchkey_step_seconds_sum":
            step += value
    return coll, calls, step


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far (every thread)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_jsonl(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.endswith("\n")]
    except OSError:
        return []


def wait_all(procs, deadline, what):
    for p in procs:
        left = max(1.0, deadline - time.monotonic())
        try:
            if p.wait(timeout=left) != 0:
                raise RuntimeError(f"{what}: a rank exited with {p.returncode}")
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{what}: timed out")


def run_latchkey(worker, p, steps, backend, tmp, timeout):
    """Rank 0's per-step records and both ranks' collective/step sums over steps 1.."""
    d = tempfile.mkdtemp(dir=tmp)
    spec = os.path.join(d, "spec.json")
    with open(spec, "w") as f:
        json.dump(spec_json(p, steps, backend), f)
    port = random.randint(30000, 49999)
    procs = []
    for r in range(TP):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(TP), LOCAL_WORLD_SIZE=str(TP),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [worker, "--standalone", "--spec", spec, "--quiet",
             "--metrics-jsonl", os.path.join(d, "steps-{rank}.jsonl"),
             "--metrics-port", "0", "--metrics-host", "127.0.0.1",
             "--port-file", os.path.join(d, "port-{rank}.json"), "--linger-seconds", "30"],
            env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, f"log-{r}"), "w")))
    deadline = time.monotonic() + timeout
    ports, first, cpu0 = {}, {}, 0.0
    try:
        while len(first) < TP or any(len(read_jsonl(os.path.join(d, f"steps-{r}.jsonl"))) < steps
                                     for r in range(TP)):
            if time.monotonic() > deadline:
                raise RuntimeError("latchkey: timed out")
            for q in procs:
                if q.poll() is not None and q.returncode != 0:
                    raise RuntimeError(f"latchkey: a rank exited with {q.returncode}, see {d}")
            for r in range(TP):
                if r not in ports and os.path.exists(os.path.join(d, f"port-{r}.json")):
                    with open(os.path.join(d, f"port-{r}.json")) as f:
                        ports[r] = json.load(f)["metrics_port"]
                if r in ports and r not in first and read_jsonl(
                        os.path.join(d, f"steps-{r}.jsonl")):
                    first[r] = scrape(ports[r])  # right after the warm-up step's record
                    if r == 0:
                        cpu0 = cpu_seconds(procs[0].pid)
            time.sleep(0.02)
        last = {r: scrape(ports[r]) for r in range(TP)}
        cpu = (cpu_seconds(procs[0].pid) - cpu0) / (steps - 1)
    finally:
        for q in procs:
            q.kill()
            q.wait()
    share = []
    for r in range(TP):
        coll = last[r][0] - first[r][0]
        calls = last[r][1] - first[r][1]
        step = last[r][2] - first[r][2]
        share.append((coll, calls, step))
    recs = read_jsonl(os.path.join(d, "steps-0.jsonl"))
    shutil.rmtree(d, ignore_errors=True)
    return recs, share, cpu


def run_peer(p, steps, tmp, timeout):
    out = os.path.join(tempfile.mkdtemp(dir=tmp), "peer.jsonl")
    cmd = [sys.executable, PEER, "--tp", str(TP), "--steps", str(steps)]
    for k in ("layers", "embd", "heads", "seq", "mb", "gas"):
        cmd += [f"--{k}", str(p[k])]
    cmd += ["--jsonl", out]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    wait_all([proc], time.monotonic() + timeout, "peer")
    recs = read_jsonl(out)
    return recs, statistics.mean(r["cpu_seconds"] for r in recs[1:steps])


def fmt(values, spec="%.0f"):
    return (spec + " (" + spec + "-" + spec + ")") % (statistics.median(values), min(values),
                                                      max(values))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="P1,P2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="windows per run, the first is warm-up")
    ap.add_argument("--backends", default="auto", help="latchkey.backend values, comma-separated")
    ap.add_argument("--worker", default=os.path.join(ROOT, "build", "worker", "latchkey-worker"))
    ap.add_argument("--baseline-worker", default="",
                    help="another latchkey-worker build, run as one more side (before/after)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    presets = ["quick"] if a.quick else a.presets.split(",")
    repeats, steps = (1, 2) if a.quick else (a.repeats, a.steps)
    if steps < 2:
        ap.error("--steps must be at least 2 (the first is warm-up)")
    backends = a.backends.split(",")
    tmp = tempfile.mkdtemp(prefix="latchkey-bench-")
    cores = len(os.sched_getaffinity(0))
    print(f"# tokens/s: latchkey vs the PyTorch {__import__('torch').__version__} eager + Gloo "
          f"peer, TP {TP}, {cores} cores, {max(1, cores // TP)} thread(s) per rank, {repeats} "
          f"repeat(s) x {steps - 1} measured step(s), order alternated per repeat\n", flush=True)
    tok_rows, share_rows, loss_rows = [], [], []
    try:
        for name in presets:
            p = PRESETS[name]
            sides = [("latchkey " + b, (a.worker, b)) for b in backends]
            if a.baseline_worker:
                sides += [("baseline " + b, (a.baseline_worker, b)) for b in backends]
            sides += [("peer", None)]
            tps = {s: [] for s, _ in sides}
            ratios = {s: [] for s, _ in sides if s != "peer"}
            shares = {s: [] for s, _ in sides if s != "peer"}
            cpus = {s: [] for s, _ in sides}
            losses = {}
            for rep in range(repeats):
                order = sides if rep % 2 == 0 else list(reversed(sides))
                step_s = {}
                for label, backend in order:
                    if backend is None:
                        recs, cpu = run_peer(p, steps, tmp, a.timeout)
                    else:
                        recs, share, cpu = run_latchkey(backend[0], p, steps, backend[1], tmp,
                                                   a.timeout)
                        shares[label].append(share)
                    measured = [r["step_seconds"] for r in recs[1:steps]]
                    step_s[label] = statistics.median(measured)
                    tps[label] += [r["tokens"] / s for r, s in zip(recs[1:steps], measured)]
                    cpus[label].append(cpu)
                    losses.setdefault(label, [r["loss"] for r in recs[:steps]])
                    print(f"  {name} repeat {rep}: {label}: step s "
                          f"{', '.join('%.3f' % s for s in measured)}", flush=True)
                for label in ratios:
                    ratios[label].append(step_s["peer"] / step_s[label])
            for label, _ in sides:
                tok_rows.append(f"| {name} | {label} | {fmt(tps[label])} | " + (
                    fmt(ratios[label], "%.2f") if label in ratios else "1") +
                    f" | {fmt(cpus[label], '%.2f')} |")
            for label, runs in shares.items():
                coll = [c for run in runs for c, _, _ in run]
                calls = [n for run in runs for _, n, _ in run]
                step = [s for run in runs for _, _, s in run]
                pct = [100.0 * c / s for c, s in zip(coll, step)]
                per_call = [1e6 * c / n for c, n in zip(coll, calls) if n]
                share_rows.append(
                    f"| {name} | {label} | {fmt([s / (steps - 1) for s in step], '%.3f')} | "
                    f"{fmt([c / (steps - 1) for c in coll], '%.3f')} | "
                    f"{statistics.median(calls) / (steps - 1):.0f} | {fmt(per_call, '%.1f')} | "
                    f"{fmt(pct, '%.1f')} |")
            for label, ls in losses.items():
                loss_rows.append(f"| {name} | {label} | " + ", ".join("%.4f" % x for x in ls) +
                                 " |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n| preset | side | tokens/s median (min-max) | vs peer, per repeat: median "
          "(min-max) | rank-0 CPU s/step, per repeat (min-max) |\n|---|---|---|---|---|")
    print("\n".join(tok_rows))
    print("\n| preset | latchkey | step s (min-max) | collective s/step (min-max) | "
          "collectives/step | us per collective (min-max) | collective share % (min-max) |\n"
          "|---|---|---|---|---|---|---|")
    print("\n".join(share_rows))
    print("(collective share: every rank's latchkey_collective_seconds sum over its "
          "latchkey_step_seconds sum, measured steps; spread over ranks and repeats)")
    print("\n| preset | side | loss per step (first repeat) |\n|---|---|---|")
    print("\n".join(loss_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
