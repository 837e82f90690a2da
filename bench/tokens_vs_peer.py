#!/usr/bin/python3
"""End-to-end tokens/s: latchkey against the plain PyTorch peer, and latchkey's collective share.

    /usr/bin/python3 bench/tokens_vs_peer.py [--presets P1,P2] [--repeats 3] [--steps 3]
        [--backends auto,gloo] [--worker build/worker/latchkey-worker] [--quick]

For each preset (P1: 24 layers, n_embd 256, 8 heads, seq 128, MB 1, GAS 32; P2: 8 layers,
n_embd 1024, 16 heads, seq 256, MB 2, GAS 4; both TP 2, MQA, vocab 256, AdamW, clipping 1.0,
the synthetic data source, coalesced K/V), each repeat runs latchkey (`latchkey-worker
--standalone`, one process per rank, torchrun-style env, once per --backends value) and the
peer (bench/peer/gpt_bigcode_tp.py), in an order that alternates from repeat to repeat, so
machine noise hits every side. latchkey runs once with `latchkey.backend: "auto"` (shm for
these same-host groups) and once with "gloo", the peer's transport: gloo against the peer is
the compute side of the difference, auto against gloo the transport side. Each run does
--steps windows; the first is warm-up and not counted. Step time is each side's own rank-0
measure: latchkey's JSONL `step_seconds`, the peer's `step_seconds` (the same span: every
micro-batch's forward and backward, the K/V reduction, the norm, clipping and the optimizer
step). Every side gets the same environment: cores / ranks threads per rank (OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS; both also set them in-process), and latchkey's malloc settings as
GLIBC_TUNABLES (the worker also sets them with mallopt; the caller's GLIBC_TUNABLES, if set,
is given to every side instead).

Every step's loss of every latchkey run must agree with the peer's of the same repeat to
LOSS_TOL (relative): both start from the same weights (one generator, seed 1, tensor by tensor
in HF order, sharded after) and read the same synthetic samples (seed 1), and run the same
fp32 ATen ops; what differs is summation order (latchkey accumulates the squared-gradient sum
in float64 where the peer takes fp32 per-tensor norms, the order of the micro-batch loss sum),
measured at 1e-7 relative or less in the loss after 3 steps; other weights or samples move it
by about 1e-3 at the first step. Clipping hardly shows in AdamW's loss (its update is invariant
to the gradient's scale but for eps), so the gradient norm of every step is checked too, to
NORM_TOL: the peer's fp32 per-tensor norms (up to 2 M squares each at P2) differ from
latchkey's float64 sum by about 3e-5 relative at P2, and a tensor the norm missed or counted
twice moves it by more than 3e-4 unless its share of the squared norm is under 0.06%. A
disagreement stops the bench with the per-step values (exit 1).

Tables (medians over every measured step of every repeat, with the min-max spread):
  1. tokens/s per side, and the ratio latchkey / peer (per repeat: median (min-max));
  2. the share of latchkey's step time spent in collectives: the worker's
     `latchkey_collective_seconds` histogram sums (every op and group) over its
     `latchkey_step_seconds` sum, from each rank's metrics endpoint, taken after the warm-up
     step and after the last one (the difference: measured steps only);
  3. the loss of each step on every side (first repeat; every repeat is checked, see above).
--quick: a 2-layer model, 2 steps, 1 repeat (a smoke run of the whole path).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench_util import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.path.join(HERE, "peer", "gpt_bigcode_tp.py")
sys.path.insert(0, os.path.join(HERE, "peer"))
from gpt_bigcode_tp import MALLOC_TUNABLES  # noqa: E402  (the peer's own folder)

PRESETS = {
    "P1": dict(layers=24, embd=256, heads=8, seq=128, mb=1, gas=32),
    "P2": dict(layers=8, embd=1024, heads=16, seq=256, mb=2, gas=4),
    "quick": dict(layers=2, embd=64, heads=4, seq=32, mb=1, gas=4),
}
TP = 2
SEED, DATA_SEED, LR, WEIGHT_DECAY, CLIP, VOCAB = 1, 1, 0.001, 0.01, 1.0, 256
LOSS_TOL = 1e-5  # relative, per step: see the module's docstring
NORM_TOL = 3e-4  # the same for the gradient norm (fp32 per-tensor norms in the peer)


def spec_json(p, steps, backend):
    return {
        "model": {"model_type": "gpt_bigcode", "n_layer": p["layers"], "n_embd": p["embd"],
                  "n_head": p["heads"], "vocab_size": VOCAB, "n_positions": p["seq"],
                  "multi_query": True},
        "train_micro_batch_size_per_gpu": p["mb"],
        "gradient_accumulation_steps": p["gas"],
        "gradient_clipping": CLIP,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
        "tensor_parallel": {"autotp_size": TP},
        "latchkey": {"seq_len": p["seq"], "steps": steps, "seed": SEED, "world_size": TP,
                     "kv_reduce": "coalesced", "backend": backend,
                     "data": {"synthetic": {"seed": DATA_SEED}}},
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


def rank_env(env, r, port):
    return dict(env, RANK=str(r), WORLD_SIZE=str(TP), LOCAL_WORLD_SIZE=str(TP),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def wait_all(procs, deadline, what):
    """Waits for every rank; the first that fails or the deadline kills them all."""
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                raise RuntimeError(f"{what}: a rank exited with "
                                   f"{[p.returncode for p in procs]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: timed out")
            time.sleep(0.05)
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError(f"{what}: a rank exited with {[p.returncode for p in procs]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def retried(what, run, tries=3):
    """run(), again (a fresh port) when a rank fails, e.g. on a port another program took."""
    for attempt in range(tries):
        try:
            return run()
        except RuntimeError as e:
            if attempt + 1 == tries:
                raise
            print(f"  {what}: {e}; again", flush=True)


def side_env(malloc=True):
    """The environment every side runs in: the same threads and allocator settings (without
    the latter, the caller's environment as it is: --baseline-peer)."""
    threads = max(1, len(os.sched_getaffinity(0)) // TP)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if malloc:
        env["GLIBC_TUNABLES"] = os.environ.get("GLIBC_TUNABLES", MALLOC_TUNABLES)
    return env


def run_latchkey(worker, p, steps, backend, tmp, timeout):
    """Rank 0's per-step records and both ranks' collective/step sums over steps 1.."""
    d = tempfile.mkdtemp(dir=tmp)
    spec = os.path.join(d, "spec.json")
    with open(spec, "w") as f:
        json.dump(spec_json(p, steps, backend), f)
    port = free_port()
    procs = []
    for r in range(TP):
        env = rank_env(side_env(), r, port)
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


def run_peer(script, env, p, steps, tmp, timeout):
    """Starts the peer's ranks as latchkey's are (torchrun-style env), and reads rank 0's lines."""
    out = os.path.join(tempfile.mkdtemp(dir=tmp), "peer.jsonl")
    cmd = [sys.executable, script, "--tp", str(TP), "--steps", str(steps)]
    for k in ("layers", "embd", "heads", "seq", "mb", "gas"):
        cmd += [f"--{k}", str(p[k])]
    cmd += ["--vocab", str(VOCAB), "--lr", str(LR), "--weight-decay", str(WEIGHT_DECAY),
            "--clip", str(CLIP), "--seed", str(SEED), "--data-seed", str(DATA_SEED),
            "--jsonl", out]
    port = free_port()
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=rank_env(env, r, port))
             for r in range(TP)]
    wait_all(procs, time.monotonic() + timeout, "peer")
    recs = read_jsonl(out)
    return recs, statistics.mean(r["cpu_seconds"] for r in recs[1:steps])


def check_losses(name, rep, losses, what="loss", tol=LOSS_TOL):
    """Exits (1) unless every side's per-step values agree with the peer's to `tol`."""
    ref = losses["peer"]
    bad = []
    for label, ls in losses.items():
        if len(ls) != len(ref):
            bad.append(f"{label}: {len(ls)} steps, the peer {len(ref)}")
            continue
        for step, (x, y) in enumerate(zip(ls, ref)):
            if not abs(x - y) <= tol * abs(y):
                bad.append(f"{label} step {step}: {what} {x!r}, the peer {y!r} "
                           f"(relative difference {abs(x - y) / abs(y):.2e} > {tol:.0e})")
    if bad:
        sys.exit(f"tokens_vs_peer: {name} repeat {rep}: the {what}s disagree, the sides do not "
                 "train the same model:\n  " + "\n  ".join(bad))
    return max(abs(x - y) / abs(y) for ls in losses.values() for x, y in zip(ls, ref))


def fmt(values, spec="%.0f"):
    return (spec + " (" + spec + "-" + spec + ")") % (statistics.median(values), min(values),
                                                      max(values))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="P1,P2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="windows per run, the first is warm-up")
    ap.add_argument("--backends", default="auto,gloo",
                    help="latchkey.backend values, comma-separated")
    ap.add_argument("--worker", default=os.path.join(ROOT, "build", "worker", "latchkey-worker"))
    ap.add_argument("--baseline-worker", default="",
                    help="another latchkey-worker build, run as one more side (before/after)")
    ap.add_argument("--baseline-peer", default="",
                    help="another peer script, run as one more side without the malloc "
                    "settings (the caller's GLIBC_TUNABLES, if any): before/after of the peer")
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
          f"repeat(s) x {steps - 1} measured step(s), order alternated per repeat, every side "
          f"with GLIBC_TUNABLES={side_env()['GLIBC_TUNABLES']}"
          f"{' (baseline peer: the caller environment as it is)' if a.baseline_peer else ''}\n",
          flush=True)
    tok_rows, share_rows, loss_rows, agree = [], [], [], []
    gloo = "latchkey gloo" if "gloo" in backends else None
    try:
        for name in presets:
            p = PRESETS[name]
            # (label, latchkey (worker, backend) or None, peer (script, env) or None)
            sides = [("latchkey " + b, (a.worker, b), None) for b in backends]
            if a.baseline_worker:
                sides += [("baseline " + b, (a.baseline_worker, b), None) for b in backends]
            sides += [("peer", None, (PEER, side_env()))]
            if a.baseline_peer:
                sides += [("baseline peer", None, (a.baseline_peer, side_env(malloc=False)))]
            labels = [s for s, _, _ in sides]
            tps = {s: [] for s in labels}
            ratios = {s: [] for s in labels}  # peer step time / this side's, per repeat
            vs_gloo = {s: [] for s in labels}  # latchkey gloo step time / this side's
            shares = {s: [] for s, lk, _ in sides if lk}
            cpus = {s: [] for s in labels}
            first_losses, worst, worst_norm = {}, 0.0, 0.0
            for rep in range(repeats):
                order = sides if rep % 2 == 0 else list(reversed(sides))
                step_s, losses, norms = {}, {}, {}
                for label, lk, peer in order:
                    if peer:
                        recs, cpu = retried(label, lambda: run_peer(peer[0], peer[1], p, steps,
                                                                    tmp, a.timeout))
                    else:
                        recs, share, cpu = retried(label, lambda: run_latchkey(
                            lk[0], p, steps, lk[1], tmp, a.timeout))
                        shares[label].append(share)
                    measured = [r["step_seconds"] for r in recs[1:steps]]
                    step_s[label] = statistics.median(measured)
                    tps[label] += [r["tokens"] / s for r, s in zip(recs[1:steps], measured)]
                    cpus[label].append(cpu)
                    losses[label] = [r["loss"] for r in recs[:steps]]
                    norms[label] = [r["grad_norm"] for r in recs[:steps]]
                    print(f"  {name} repeat {rep}: {label}: step s "
                          f"{', '.join('%.3f' % s for s in measured)}", flush=True)
                worst = max(worst, check_losses(name, rep, losses))
                worst_norm = max(worst_norm, check_losses(name, rep, norms, "grad_norm", NORM_TOL))
                first_losses = first_losses or losses
                for label in labels:
                    ratios[label].append(step_s["peer"] / step_s[label])
                    if gloo:
                        vs_gloo[label].append(step_s[gloo] / step_s[label])
            for label in labels:
                tok_rows.append(f"| {name} | {label} | {fmt(tps[label])} | "
                                f"{fmt(ratios[label], '%.2f')} | " +
                                (f"{fmt(vs_gloo[label], '%.2f')} | " if gloo else "") +
                                f"{fmt(cpus[label], '%.2f')} |")
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
            for label in labels:
                loss_rows.append(f"| {name} | {label} | " +
                                 ", ".join("%.6f" % x for x in first_losses[label]) + " |")
            agree.append(f"{name}: loss {worst:.1e}, grad_norm {worst_norm:.1e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n| preset | side | tokens/s median (min-max) | vs peer, per repeat: median "
          "(min-max) | " + ("vs latchkey gloo, per repeat (min-max) | " if gloo else "") +
          "rank-0 CPU s/step, per repeat (min-max) |\n|---|---|---|---|---|" +
          ("---|" if gloo else ""))
    print("\n".join(tok_rows))
    print("\n| preset | latchkey | step s (min-max) | collective s/step (min-max) | "
          "collectives/step | us per collective (min-max) | collective share % (min-max) |\n"
          "|---|---|---|---|---|---|---|")
    print("\n".join(share_rows))
    print("(collective share: every rank's latchkey_collective_seconds sum over its "
          "latchkey_step_seconds sum, measured steps; spread over ranks and repeats)")
    print("\n| preset | side | loss per step (first repeat) |\n|---|---|---|")
    print("\n".join(loss_rows))
    print(f"(every step of every repeat checked against the peer's: largest relative "
          f"difference {'; '.join(agree)}; tolerances {LOSS_TOL:.0e} and {NORM_TOL:.0e})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
