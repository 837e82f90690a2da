#!/usr/bin/python3
"""Stragglers: a slow rank named, and worked around by uneven micro-batches per DP replica.

    bench/stragglers.py [--build build] [--steps 24] [--check]

Real processes on this machine: a latchkey-coordinator on loopback, the job submitted with the
CLI, and one latchkey-worker per rank started by this script with `taskset`, each DP replica
pinned to its own core (replica d on core d), so the replicas compute side by side. A busy loop
(`sh -c 'while :; do :; done'`) pinned to core 1 shares that core with replica 1: its ranks
compute at about half speed (a third each for DP 2 x TP 2, whose replica holds two ranks).

The model is the built-in job's (4 layers, n_embd 128, MQA, seq 128, micro-batch 4), GAS 6,
SGD (so equal gradients give equal weights), synthetic data. Runs:
  DP 2 x TP 1, rank 1 slowed: static (latchkey.stragglers.rebalance false) and rebalanced;
  DP 2 x TP 1, rebalanced, the busy loop stopped half-way (the split goes back to even);
  DP 2 x TP 1, nothing slowed, 50 steps: no rank may be named (false positives);
  DP 2 x TP 2 (coalesced K/V), replica 1 slowed: static and rebalanced.

Per run the table shows the median window time (the slowest rank's step_seconds, steps from
the 5th on: the first windows are decided before any speed is measured) with its interquartile
range, the speed-up of the rebalanced run over the static one, the splits the coordinator chose
(from the latches, `latchkey --json latches`: windows -> micro-batches per DP replica), the
largest relative deviation of any rank's per-step loss from the static run (the same samples:
only the summation order may differ), the K/V all-reduces per step (every rank, every step:
the set of values) and when the slow rank was named (the audit's straggler events: the step
whose report named it, `since` its streak's first step).

--check exits 1 unless: the slowed rank (every rank of the slowed replica) and only it is named
within 5 windows; the run without a straggler names none; losses agree within 1e-5; the K/V
counts per step are the static run's; the split is back to even by window E + 8, E being the
step in flight when the busy loop stopped (the lag of the mechanism: that mixed step, a majority
of the 5-step sample window, the latch lookahead of 2, so E + 6 is the first window decided on
fast samples alone; two more windows for the split to settle, its hysteresis deciding on medians
that still straddle the change); and rebalancing makes the window at least 1.15x faster on DP 2 x TP 1 (the goal,
1.3x at half speed, is reported; two shared cores are noisy) and 1.05x on DP 2 x TP 2 (whose
slowed ranks run at two thirds of the others' speed: 1.2x at best with GAS 6).
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench_util import free_port

MODEL = {"model_type": "gpt_bigcode", "n_layer": 4, "n_embd": 128, "n_head": 8,
         "vocab_size": 256, "n_positions": 128, "multi_query": True}
GAS = 6


def make_spec(tp, rebalance, steps):
    return {
        "model": MODEL,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": GAS,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "zero_optimization": {"stage": 1},
        "tensor_parallel": {"autotp_size": tp},
        "latchkey": {"seq_len": 128, "steps": steps, "seed": 3, "world_size": 2 * tp,
                     "kv_reduce": "coalesced", "data": {"synthetic": {"seed": 3}},
                     "stragglers": {"rebalance": rebalance}},
    }


def read_jsonl(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(r, dict) and "step" in r:
                rows[r["step"]] = r  # the last record of a step
    return rows


def stop(proc, sig=signal.SIGKILL):
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass


class Run:
    """One job: the coordinator, the busy loop and the workers, all stopped on every path."""

    def __init__(self, bins, root, name, tp, rebalance, steps, slow, slow_until=None):
        self.bins, self.name, self.tp, self.steps = bins, name, tp, steps
        self.world = 2 * tp
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        self.rebalance, self.slow, self.slow_until = rebalance, slow, slow_until
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LATCHKEY_")}
        self.env["XDG_CONFIG_HOME"] = os.path.join(self.dir, "config")
        self.procs = []
        self.busy = None
        self.slow_ended_at = None  # the step rank 0 had completed when the busy loop stopped

    def spawn(self, args, log, extra_env=None):
        env = dict(self.env, **(extra_env or {}))
        p = subprocess.Popen(args, env=env, stdout=open(os.path.join(self.dir, log), "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def cli(self, *args):
        r = subprocess.run([self.bins["cli"], "--coordinator", self.addr, "--json", *args],
                           env=self.env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"latchkey {' '.join(args)}: exit {r.returncode}: {r.stderr}")
        return json.loads(r.stdout.splitlines()[0])

    def run(self):
        try:
            return self._run()
        finally:
            stop(self.busy)
            for p in self.procs:
                stop(p)

    def _run(self):
        ports = os.path.join(self.dir, "ports.json")
        coord = self.spawn([self.bins["coordinator"], "--listen", "127.0.0.1:0", "--db",
                            os.path.join(self.dir, "coordinator.db"), "--metrics-port", "-1",
                            "--port-file", ports, "--shutdown-grace", "1"], "coordinator.log")
        deadline = time.time() + 30
        while not os.path.exists(ports) and coord.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        with open(ports) as f:
            self.addr = f"127.0.0.1:{json.load(f)['grpc_port']}"
        spec_path = os.path.join(self.dir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(make_spec(self.tp, self.rebalance, self.steps), f)
        sub = self.cli("submit", spec_path, "--job-id", self.name, "--rendezvous-port",
                       str(free_port()))
        token = sub.get("join_token") or sub.get("joinToken")
        if self.slow is not None:
            self.busy = subprocess.Popen(["taskset", "-c", str(self.slow), "/bin/sh", "-c",
                                          "while :; do :; done"], start_new_session=True)
        for rank in range(self.world):
            cpu = (rank // self.tp) % max(1, os.cpu_count() or 1)
            self.spawn(["taskset", "-c", str(cpu), self.bins["worker"], "--coordinator", self.addr,
                        "--job", self.name, "--join-token", token, "--metrics-jsonl",
                        os.path.join(self.dir, "steps-{rank}.jsonl"), "--quiet"],
                       f"worker-{rank}.log",
                       {"RANK": str(rank), "LOCAL_WORLD_SIZE": str(self.world)})
        deadline = time.time() + 60 + 3 * self.steps
        state = "?"
        while time.time() < deadline:
            status = self.cli("status", self.name)
            state = status.get("state", "?")
            if state in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
                break
            if self.busy is not None and self.slow_until is not None:
                done = len(read_jsonl(os.path.join(self.dir, "steps-0.jsonl")))
                if done >= self.slow_until:
                    stop(self.busy)
                    self.busy = None
                    self.slow_ended_at = done
            time.sleep(0.2)
        if state != "JOB_STATE_SUCCEEDED":
            raise RuntimeError(f"{self.name}: the job is {state}: "
                               f"{status.get('failure_reason', '')} (logs in {self.dir})")
        self.status = status
        self.audit = self.cli("latches", self.name)
        self.ranks = [read_jsonl(os.path.join(self.dir, f"steps-{r}.jsonl"))
                      for r in range(self.world)]
        return self

    # --- what the run shows -------------------------------------------------------------------
    def window_seconds(self, first=5):
        return [max(r[s]["step_seconds"] for r in self.ranks)
                for s in range(first, self.steps)]

    def splits(self):
        """[(first window, last window, split text)] from the published latches."""
        out = []
        for latch in self.audit.get("latches", []):
            split = latch.get("replica_micro_batches") or []
            text = ",".join(str(c) for c in split) if split else "even"
            w = int(latch["window"])
            if out and out[-1][2] == text and out[-1][1] == w - 1:
                out[-1] = (out[-1][0], w, text)
            else:
                out.append((w, w, text))
        return out

    def first_even_after(self, step):
        for first, last, text in self.splits():
            if text == "even" and first >= step:
                return first
        return None

    def named(self):
        """{rank: (step that named it, since step)} from the audit's straggler events."""
        out = {}
        for e in self.audit.get("events", []):
            if e.get("kind") != "straggler":
                continue
            m = re.match(r"rank (\d+) .* since step (\d+) \(threshold [0-9.]+x in (\d+) ",
                         e.get("message", ""))
            if m:
                rank, since, windows = int(m[1]), int(m[2]), int(m[3])
                out.setdefault(rank, (since + windows - 1, since))
        return out

    def kv_per_step(self):
        return sorted({r[s]["kv_allreduce_calls"] for r in self.ranks for s in r})


def median_iqr(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return statistics.median(values), q[0], q[2]


def max_loss_dev(run, ref):
    dev = 0.0
    for r in range(run.world):
        for s, rec in run.ranks[r].items():
            a, b = rec["loss"], ref.ranks[r][s]["loss"]
            dev = max(dev, abs(a - b) / max(abs(b), 1e-30))
    return dev


# The first window decided on fast samples alone is E + 1 (the mixed step) + 3 (a majority of the
# sample window of 5) + 2 (the coordinator's latch lookahead); two more let the split settle.
SETTLE_WINDOWS = 1 + 3 + 2 + 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    bins = {"coordinator": os.path.join(args.build, "server", "latchkey-coordinator"),
            "cli": os.path.join(args.build, "client", "latchkey"),
            "worker": os.path.join(args.build, "worker", "latchkey-worker")}
    for b in bins.values():
        if not os.access(b, os.X_OK):
            sys.exit(f"stragglers: {b} is not built")
    if (os.cpu_count() or 1) < 2 or shutil.which("taskset") is None:
        print("stragglers: skipped: needs 2 cores and taskset (util-linux)")
        return 77  # ctest: SKIP_RETURN_CODE
    root = tempfile.mkdtemp(prefix="latchkey-stragglers-")
    steps = args.steps
    problems = []
    try:
        runs = {}
        plan = [("dp2-static", 1, False, steps, 1, None),
                ("dp2-rebalanced", 1, True, steps, 1, None),
                ("dp2-slow-ends", 1, True, steps + 8, 1, (steps + 8) // 2),
                ("dp2-no-straggler", 1, False, 50, None, None),
                ("dp2tp2-static", 2, False, steps, 1, None),
                ("dp2tp2-rebalanced", 2, True, steps, 1, None)]
        for name, tp, rebalance, n, slow, until in plan:
            t0 = time.time()
            runs[name] = Run(bins, root, name, tp, rebalance, n, slow, until).run()
            print(f"  ran {name} in {time.time() - t0:.0f} s", file=sys.stderr)

        print(f"Stragglers, real processes, one DP replica per core, a busy loop sharing "
              f"core 1 (GAS {GAS}, {os.cpu_count()} cores)")
        print("| run | window s median (IQR) | speed-up | splits chosen (windows: per replica) "
              "| loss max rel dev | K/V per step | named (step; since) |")
        print("|---|---|---|---|---|---|---|")
        for name, run in runs.items():
            med, q1, q3 = median_iqr(run.window_seconds())
            static = runs.get(name.replace("rebalanced", "static").replace("slow-ends", "static"))
            speedup = ""
            if static is not None and "rebalanced" in name:
                speedup = f"{median_iqr(static.window_seconds())[0] / med:.2f}x"
            splits = "; ".join(f"{a}-{b}: {t}" for a, b, t in run.splits())
            dev = max_loss_dev(run, static) if static is not None and static.steps == run.steps \
                else None
            named = ", ".join(f"rank {r} (step {s}; since {since})"
                              for r, (s, since) in sorted(run.named().items())) or "none"
            print(f"| {name} | {med:.3f} ({q1:.3f}-{q3:.3f}) | {speedup} | {splits} | "
                  f"{'' if dev is None else f'{dev:.1e}'} | {run.kv_per_step()} | {named} |")
        ends = runs["dp2-slow-ends"]
        back = ends.first_even_after(ends.slow_ended_at or 0)
        print(f"busy loop stopped after step {ends.slow_ended_at}; the split is even again from "
              f"window {back}")

        # The acceptance points.
        for name, slow_ranks in (("dp2-static", {1}), ("dp2-rebalanced", {1}),
                                 ("dp2tp2-static", {2, 3}), ("dp2tp2-rebalanced", {2, 3})):
            named = runs[name].named()
            if set(named) != slow_ranks:
                problems.append(f"{name}: named {sorted(named)}, the slowed ranks are "
                                f"{sorted(slow_ranks)}")
            late = {r: s for r, (s, _) in named.items() if s > 4}
            if late:
                problems.append(f"{name}: named later than 5 windows: {late}")
        if runs["dp2-no-straggler"].named():
            problems.append(f"dp2-no-straggler: named {runs['dp2-no-straggler'].named()}")
        for tag in ("dp2", "dp2tp2"):
            st, rb = runs[f"{tag}-static"], runs[f"{tag}-rebalanced"]
            dev = max_loss_dev(rb, st)
            if dev > 1e-5:
                problems.append(f"{tag}: losses deviate by {dev:.2e} (> 1e-5)")
            for r in range(st.world):
                for s in range(st.steps):
                    a, b = rb.ranks[r][s]["kv_allreduce_calls"], st.ranks[r][s]["kv_allreduce_calls"]
                    if a != b:
                        problems.append(f"{tag}: rank {r} step {s}: {a} K/V all-reduces, "
                                        f"static {b}")
            if not any(t != "even" for _, _, t in rb.splits()):
                problems.append(f"{tag}: the rebalanced run never split unevenly")
            speedup = median_iqr(st.window_seconds())[0] / median_iqr(rb.window_seconds())[0]
            floor = 1.15 if tag == "dp2" else 1.05  # half speed; a third against a half
            if speedup < floor:
                problems.append(f"{tag}: rebalancing is only {speedup:.2f}x faster (< {floor})")
        if back is None or back > (ends.slow_ended_at or 0) + SETTLE_WINDOWS:
            problems.append(f"dp2-slow-ends: the split is even again only from window {back}")
    finally:
        if not problems:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"runs kept in {root}")
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if (args.check and problems) else 0


if __name__ == "__main__":
    sys.exit(main())
