#!/usr/bin/python3
"""Recovery time: how long `latchkey up` takes to get a job training again after a worker dies.

    bench/recovery_time.py [--build build] [--repeats 3] [--models demo,deep] [--kill-step 4]
                           [--no-baseline]

Two models, each on world 4 (DP 2 x TP 2, ZeRO-1 AdamW, synthetic data, a resumable checkpoint
every 2 steps, so after steps 1, 3, 5, ...):
  demo  the model block and settings of the built-in job (client/cli/builtin_spec.h: 4 layers,
        n_embd 128, 8 heads, MQA, micro-batch 4, GAS 4, seq 128, warm-up + cosine lr), 12 steps;
  deep  24 layers, n_embd 256, 8 heads, MQA, micro-batch 1, GAS 1, seq 32 (a step takes well
        under a few seconds on a small CPU machine), 10 steps.

Each repeat runs `latchkey up --spec SPEC --run-dir D` in the background, parses up's stdout for
the coordinator address, the job id and the pid of rank 1's worker (`worker 1     pid P ...`),
and watches rank 0's JSONL (D/steps-0.jsonl), stamping (time.monotonic) the moment each line
appears. Once the line of step --kill-step (default 4, after the second checkpoint, step 3) is
there, it sends SIGKILL to rank 1's worker and measures:
  recovery        kill -> the first resumed step: the first line appended to steps-0.jsonl after
                  the kill that re-runs a step already in the file (a window of the old attempt
                  that still completed on rank 0 is not counted as resumed; in practice the
                  first line after the kill is the resumed one);
  kill->attempt   kill -> `latchkey --coordinator ADDR --json status JOB` first shows attempt 2
                  (polled back to back from a thread; the stamp is the midpoint of the call that
                  first showed it, so its resolution is about half a call, shown as `poll ms`);
  attempt->step   that moment -> the first resumed step.
The job must then finish: up's exit code is reported (0 expected). Unless --no-baseline, one
uninterrupted run per model gives every step's loss, and each killed run's last record of every
step must have exactly that loss (`loss == baseline`; the e2e tests check byte equality of the
weights, this only checks the JSONL).

The table: model, bytes of one committed checkpoint (du -sb of a step folder, all 4 rank files
and the manifest), step seconds (median `step_seconds` of rank 0's JSONL over the killed runs),
recovery seconds median (min-max) over repeats, and the same for the two parts. Run it where
nothing else loads the CPUs if the numbers are to mean much: the 4 workers share the machine.
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
import threading
import time

from bench_util import read_appended_lines

DEMO_MODEL = {"model_type": "gpt_bigcode", "n_layer": 4, "n_embd": 128, "n_head": 8,
              "vocab_size": 256, "n_positions": 128, "multi_query": True}
DEEP_MODEL = {"model_type": "gpt_bigcode", "n_layer": 24, "n_embd": 256, "n_head": 8,
              "vocab_size": 256, "n_positions": 128, "multi_query": True}


def make_spec(model):
    if model == "demo":
        steps = 12
        spec = {
            "model": DEMO_MODEL,
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 4,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
            "scheduler": {"type": "WarmupCosineLR",
                          "params": {"total_num_steps": steps, "warmup_num_steps": 5,
                                     "warmup_type": "linear"}},
        }
        seq_len = 128
    else:
        steps = 10
        spec = {
            "model": DEEP_MODEL,
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
        }
        seq_len = 32
    spec["zero_optimization"] = {"stage": 1}
    spec["tensor_parallel"] = {"autotp_size": 2}
    spec["latchkey"] = {"seq_len": seq_len, "steps": steps, "seed": 1, "world_size": 4,
                        "kv_reduce": "auto", "data": {"synthetic": {"seed": 1}},
                        "checkpoint": {"dir": "ckpt", "every_steps": 2}}
    return spec, steps


class LineClock:
    """Stamps (time.monotonic) the appearance of each whole line of a file being appended."""

    def __init__(self, path):
        self.path = path
        self.rows = []  # (stamp, parsed line)
        self._seen = 0

    def poll(self):
        now, complete, self._seen = read_appended_lines(self.path, self._seen)
        for line in complete.splitlines():
            if line.strip():
                self.rows.append((now, json.loads(line)))


class UpOutput:
    """Reads up's stdout in a thread: coordinator address, job id, the first pid of each rank."""

    def __init__(self, proc, log_path):
        self.coordinator = None
        self.job = None
        self.pids = {}
        self._log = open(log_path, "w")
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc):
        for raw in proc.stdout:
            self._log.write(raw)
            self._log.flush()
            for line in re.split(r"[\r\n]", raw):
                m = re.match(r"coordinator\s+(\S+:\d+)\s", line)
                if m and self.coordinator is None:
                    self.coordinator = m.group(1)
                m = re.match(r"job\s+(\S+)\s", line)
                if m and self.job is None:
                    self.job = m.group(1)
                m = re.match(r"worker (\d+)\s+pid (\d+)", line)
                if m and int(m.group(1)) not in self.pids:
                    self.pids[int(m.group(1))] = int(m.group(2))

    def join(self):
        self._thread.join(timeout=10)
        self._log.close()


class AttemptWatch:
    """Polls `latchkey --json status JOB` back to back until the job's attempt is >= 2."""

    def __init__(self, latchkey, coordinator, job):
        self.args = [latchkey, "--coordinator", coordinator, "--json", "status", job]
        self.stamp = None
        self.call_seconds = []
        self.status = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        deadline = time.monotonic() + 300
        while not self._stop and time.monotonic() < deadline:
            t0 = time.monotonic()
            r = subprocess.run(self.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
            t1 = time.monotonic()
            self.call_seconds.append(t1 - t0)
            if r.returncode != 0:
                continue
            try:
                st = json.loads(r.stdout.splitlines()[0])
            except (ValueError, IndexError):
                continue
            if st.get("attempt", 1) >= 2:
                self.stamp = (t0 + t1) / 2
                self.status = st
                return

    def join(self):
        self._thread.join(timeout=310)

    def stop(self):
        self._stop = True


def du_bytes(path):
    out = subprocess.run(["du", "-sb", path], stdout=subprocess.PIPE, text=True, check=True)
    return int(out.stdout.split()[0])


def one_run(a, model, out, kill):
    spec, steps = make_spec(model)
    os.makedirs(out, exist_ok=True)
    spec_path = f"{out}/spec.json"
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    run_dir = f"{out}/run"
    latchkey = f"{a.build}/client/latchkey"
    proc = subprocess.Popen([latchkey, "up", "--spec", spec_path, "--run-dir", run_dir],
                            stdout=subprocess.PIPE, stderr=open(f"{out}/up.err", "w"),
                            text=True, bufsize=1)
    up = UpOutput(proc, f"{out}/up.out")
    clock = LineClock(f"{run_dir}/steps-0.jsonl")
    t_kill = None
    watch = None
    start = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() - start > a.deadline:
            proc.kill()
            sys.exit(f"{out}: up did not finish within {a.deadline} s")
        clock.poll()
        if (kill and t_kill is None and 1 in up.pids and up.coordinator and up.job and
                any(r["step"] >= a.kill_step for _, r in clock.rows)):
            os.kill(up.pids[1], signal.SIGKILL)
            t_kill = time.monotonic()
            watch = AttemptWatch(latchkey, up.coordinator, up.job)
        time.sleep(0.002)
    clock.poll()
    up.join()
    rc = proc.returncode
    result = {"rc": rc, "rows": [r for _, r in clock.rows],
              "step_seconds": [r["step_seconds"] for _, r in clock.rows]}
    ckpt = f"{out}/ckpt"
    folders = sorted(d for d in os.listdir(ckpt) if d.startswith("step-")) if os.path.isdir(
        ckpt) else []
    result["ckpt_bytes"] = du_bytes(f"{ckpt}/{folders[-1]}") if folders else None
    last = {}
    for _, r in clock.rows:
        last[r["step"]] = r["loss"]
    result["loss"] = last
    result["complete"] = sorted(last) == list(range(steps))
    if not kill:
        return result
    if t_kill is None:
        sys.exit(f"{out}: the job ended (exit {rc}) before step {a.kill_step} was seen")
    watch.stop()
    watch.join()
    before = [r["step"] for t, r in clock.rows if t <= t_kill]
    seen_max = max(before) if before else -1
    resumed = None
    for t, r in clock.rows:
        if t <= t_kill:
            continue
        if r["step"] <= seen_max:  # a step already in the file: re-run by the new attempt
            resumed = (t, r["step"])
            break
        seen_max = max(seen_max, r["step"])
    if resumed is None:
        sys.exit(f"{out}: no resumed step after the kill (exit {rc}); see {run_dir}")
    result.update(
        recovery=resumed[0] - t_kill, resumed_step=resumed[1], killed_at=max(before),
        kill_to_attempt=None if watch.stamp is None else watch.stamp - t_kill,
        attempt_to_step=None if watch.stamp is None else resumed[0] - watch.stamp,
        poll_ms=1e3 * statistics.median(watch.call_seconds) if watch.call_seconds else None,
        resume_step=(watch.status or {}).get("resume_step"))
    return result


def spread(values, fmt="{:.2f}"):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return (fmt.format(statistics.median(values)) + " (" + fmt.format(min(values)) + "-" +
            fmt.format(max(values)) + ")")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="demo,deep")
    ap.add_argument("--kill-step", type=int, default=4)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--deadline", type=float, default=600, help="seconds per run")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    if a.kill_step < 4:
        sys.exit("--kill-step must be at least 4 (after the second checkpoint, step 3)")
    work = tempfile.mkdtemp(prefix="latchkey-recovery-")
    print(f"build {a.build}; runs in {work}; kill -9 of rank 1 once rank 0's JSONL shows step "
          f"{a.kill_step}", flush=True)
    summary = []
    for model in a.models.split(","):
        _, steps = make_spec(model)
        if a.kill_step >= steps - 1:
            sys.exit(f"--kill-step {a.kill_step} leaves no steps after it for {model}")
        base = None
        if not a.no_baseline:
            base = one_run(a, model, f"{work}/{model}-baseline", kill=False)
            if base["rc"] != 0 or not base["complete"]:
                sys.exit(f"{model}: the uninterrupted run failed (exit {base['rc']})")
        runs = []
        for i in range(a.repeats):
            r = one_run(a, model, f"{work}/{model}-{i}", kill=True)
            same = None if base is None else (r["loss"] == base["loss"])
            r["same_loss"] = same
            runs.append(r)
            print(f"  {model} #{i}: exit {r['rc']}, killed at step {r['killed_at']}, resumed "
                  f"at step {r['resumed_step']} (status resume_step {r['resume_step']}), "
                  f"recovery {r['recovery']:.3f} s, kill->attempt "
                  f"{r['kill_to_attempt'] if r['kill_to_attempt'] is None else round(r['kill_to_attempt'], 3)} s, "
                  f"poll {r['poll_ms']:.0f} ms, all steps {r['complete']}, "
                  f"loss == baseline {same}", flush=True)
        summary.append((model, runs))
    print("\n| model | checkpoint bytes | step s (median) | recovery s median (min-max) "
          "| kill->attempt 2 s | attempt 2->first step s | poll ms | up exit codes "
          "| loss == uninterrupted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, runs in summary:
        m = DEMO_MODEL if model == "demo" else DEEP_MODEL
        name = f"{model} ({m['n_layer']}L n_embd {m['n_embd']})"
        step_s = statistics.median([s for r in runs for s in r["step_seconds"]])
        ckpt = runs[0]["ckpt_bytes"]
        same = [r["same_loss"] for r in runs]
        print(f"| {name} | {ckpt} | {step_s:.3f} | {spread([r['recovery'] for r in runs])} "
              f"| {spread([r['kill_to_attempt'] for r in runs])} "
              f"| {spread([r['attempt_to_step'] for r in runs])} "
              f"| {spread([r['poll_ms'] for r in runs], '{:.0f}')} "
              f"| {','.join(str(r['rc']) for r in runs)} "
              f"| {'n/a' if None in same else ('yes' if all(same) else 'NO')} |")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
