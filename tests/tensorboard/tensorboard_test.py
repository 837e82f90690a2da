#!/usr/bin/env python3
"""The TensorBoard event files of real `latchkey up` jobs, read by the real TensorBoard (its
EventAccumulator and event file loader, tensorboard 2.16.2 from PyPI, tests/tensorboard/
requirements.txt):
  - a job with evaluation and checkpoints: every tag of docs/observability.md is there, with the
    rank-0 JSONL's steps and its values rounded to float32;
  - rank 0 killed with kill -9 mid-run (up's supervisor starts it again and the job resumes from
    its checkpoint): a second event file that starts with SessionLog START at the resume step,
    one value per step per tag equal to the JSONL's last record of that step, and the killed
    writer's file still readable;
  - copies of an event file cut inside its last record and inside that record's header load with
    every whole record and nothing after.

Runs inside the venv of scripts/tensorboard-venv.sh; started with another interpreter it
re-executes itself with the venv's python. Without the venv it skips (exit 77) naming the
command that makes it; under CI=true it fails instead.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from tool_venv import run_in_venv  # noqa: E402

ARGS = None


def spec(steps, checkpoint_every, eval_every):
    """A small synthetic TP 2 job on 2 workers, with evaluation and checkpoints."""
    return {
        "model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
                  "vocab_size": 256, "n_positions": 64, "multi_query": True},
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
        "tensor_parallel": {"autotp_size": 2},
        "zero_optimization": {"stage": 1},
        "managed_gradient_accumulation": True,
        "latchkey": {
            "seq_len": 32, "steps": steps, "world_size": 2, "kv_reduce": "auto",
            "data": {"synthetic": {"seed": 1}},
            "checkpoint": {"dir": "ckpt", "every_steps": checkpoint_every, "keep": 2},
            "eval": {"tokens_file": "eval.bin", "every_steps": eval_every, "samples": 2},
        },
    }


class Job:
    """`latchkey up` on a spec in a fresh folder; its output in up.log."""

    def __init__(self, spec_obj):
        self.dir = tempfile.mkdtemp(prefix="latchkey-tb-")
        self.run = os.path.join(self.dir, "run")
        self.tb = os.path.join(self.run, "tensorboard")
        tokens = bytes(((i * 37) % 256) for i in range(4 * 32 + 1))
        with open(os.path.join(self.dir, "eval.bin"), "wb") as f:
            f.write(b"".join(bytes([t, 0]) for t in tokens))  # uint16 little-endian
        self.spec = os.path.join(self.dir, "spec.json")
        with open(self.spec, "w") as f:
            json.dump(spec_obj, f)
        self.log_path = os.path.join(self.dir, "up.log")
        self.env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(self.dir, "config"),
                        XDG_STATE_HOME=os.path.join(self.dir, "state"))
        self.proc = None

    def start(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [ARGS.cli, "up", "--spec", self.spec, "--run-dir", self.run], env=self.env,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout=400):
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.log.close()

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def jsonl(self):
        path = os.path.join(self.run, "steps-0.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(l) for l in f if l.endswith("\n") and l.strip()]

    def event_files(self):
        return sorted(os.path.join(self.tb, n) for n in os.listdir(self.tb)
                      if n.startswith("events.out.tfevents."))

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def as_f32(pairs):
    import numpy

    return [(s, float(numpy.float32(v))) for s, v in pairs]


class TensorboardTest(unittest.TestCase):
    def assert_matches_jsonl(self, got, by_step, tags_expected):
        want = tb_events.expected_scalars(by_step)
        self.assertEqual(sorted(got), sorted(tags_expected))
        self.assertEqual(sorted(want), sorted(tags_expected))
        for tag in tags_expected:
            with self.subTest(tag=tag):
                self.assertEqual([s for s, _ in got[tag]], [s for s, _ in want[tag]])
                self.assertEqual(got[tag], as_f32(want[tag]))

    def test_every_tag_with_the_jsonl_steps_and_float32_values(self):
        job = Job(spec(steps=12, checkpoint_every=4, eval_every=4))
        self.addCleanup(job.close)
        job.start()
        rc = job.wait()
        out = job.output()
        self.assertEqual(rc, 0, out[-4000:])
        self.assertIn(f"tensorboard  tensorboard --logdir {job.tb}\n", out)
        with open(os.path.join(job.run, "spec.json")) as f:
            self.assertEqual(json.load(f)["latchkey"]["tensorboard"], {"dir": job.tb})
        files = job.event_files()
        self.assertEqual(len(files), 1, files)
        first = tb_events.events(files[0])
        self.assertEqual(first[0].file_version, "brain.Event:2")
        self.assertEqual(first[1].session_log.status, first[1].session_log.START)
        self.assertEqual(first[1].step, 0)
        by_step = tb_events.jsonl_by_step(os.path.join(job.run, "steps-0.jsonl"))
        self.assertEqual(sorted(by_step), list(range(12)))
        got = tb_events.accumulate(job.tb)
        self.assert_matches_jsonl(got, by_step, tb_events.TAGS)
        self.assertEqual([s for s, _ in got["eval_loss"]], [3, 7, 11])
        self.assertEqual([s for s, _ in got["checkpoint_seconds"]], [3, 7, 11])
        print(f"one attempt: {len(got)} tags x {len(got['loss'])} steps, loss "
              f"{got['loss'][0][1]:.4f} -> {got['loss'][-1][1]:.4f}, file "
              f"{os.path.getsize(files[0])} bytes")
        # Whole records, read independently from the framing, are exactly the events loaded.
        with open(files[0], "rb") as f:
            data = f.read()
        ends = tb_events.whole_records(data)
        self.assertEqual(ends[-1], len(data))
        self.assertEqual(len(ends), len(first))
        self.assertEqual(len(first), 2 + 12)

        # Truncated copies: inside the last record's payload, and inside its 12-byte header.
        last_start = ends[-2]
        for name, cut in (("payload", last_start + 12 + 5), ("header", last_start + 6)):
            with self.subTest(cut=name):
                folder = os.path.join(job.dir, "cut-" + name)
                os.makedirs(folder)
                with open(os.path.join(folder, os.path.basename(files[0])), "wb") as f:
                    f.write(data[:cut])
                loaded = tb_events.events(os.path.join(folder, os.path.basename(files[0])))
                self.assertEqual([e.SerializeToString() for e in loaded],
                                 [e.SerializeToString() for e in first[:-1]])
                cut_got = tb_events.accumulate(folder)
                for tag in cut_got:
                    self.assertEqual(cut_got[tag], [p for p in got[tag] if p[0] < 11])
                self.assertEqual(sorted(cut_got), sorted(tb_events.TAGS))  # step 3 and 7 kept

    def test_kill_9_of_rank_0_then_resume_gives_one_curve(self):
        steps = ARGS.resume_steps
        job = Job(spec(steps=steps, checkpoint_every=4, eval_every=4))
        self.addCleanup(job.close)
        job.start()
        # Rank 0 once it has committed a checkpoint and trained a step past it: its newest step
        # is the first after a checkpointed one (checkpoint_every 4: 3 steps before the next
        # checkpoint), so the kill lands between checkpoints and the resume redoes a step.
        deadline = time.time() + 240
        pid = None
        while time.time() < deadline:
            m = re.search(r"^worker 0 +pid ([0-9]+)", job.output(), re.M)
            recs = job.jsonl()
            past = (len(recs) >= 10 and recs[-1]["step"] % 4 == 0
                    and any("checkpoint_seconds" in r for r in recs))
            if m and past:
                pid = int(m.group(1))
                break
            if job.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.assertIsNotNone(pid, "rank 0 never got past a checkpoint:\n" + job.output()[-4000:])
        killed_at = len(job.jsonl())
        self.assertLess(killed_at, steps, "the job ended before the kill: raise --resume-steps")
        os.kill(pid, signal.SIGKILL)
        rc = job.wait()
        out = job.output()
        self.assertEqual(rc, 0, out[-4000:])
        m = re.search(r"recovery +attempt 2 .* from the checkpoint after step ([0-9]+)", out)
        self.assertIsNotNone(m, out[-4000:])
        resume = int(m.group(1)) + 1
        files = job.event_files()
        self.assertEqual(len(files), 2, files)
        first, second = tb_events.events(files[0]), tb_events.events(files[1])
        self.assertEqual(second[0].file_version, "brain.Event:2")
        self.assertEqual(second[1].session_log.status, second[1].session_log.START)
        self.assertEqual(second[1].step, resume)
        self.assertEqual([e.step for e in second[2:]], list(range(resume, steps)))
        # The killed writer's file: every whole record loads and nothing after; its steps go
        # past the resume step (they are the ones TensorBoard drops).
        with open(files[0], "rb") as f:
            data = f.read()
        ends = tb_events.whole_records(data)
        self.assertEqual(len(first), len(ends))
        record = max(b - a for a, b in zip([0] + ends, ends))
        self.assertLess(len(data) - ends[-1], record)  # at most a cut record's bytes
        self.assertEqual([e.step for e in first[2:]], list(range(len(first) - 2)))
        self.assertGreaterEqual(len(first) - 2, resume, "no step of the first attempt redone")
        recs = job.jsonl()
        self.assertGreater(len(recs), steps, "the JSONL has no repeated steps")
        by_step = tb_events.jsonl_by_step(os.path.join(job.run, "steps-0.jsonl"))
        self.assertEqual(sorted(by_step), list(range(steps)))
        got = tb_events.accumulate(job.tb)
        self.assert_matches_jsonl(got, by_step, tb_events.TAGS)
        for tag, pairs in got.items():
            self.assertEqual(len({s for s, _ in pairs}), len(pairs), tag)
        print(f"resume: killed after {killed_at} JSONL records, {len(first) - 2} steps in the "
              f"first file ({len(data) - ends[-1]} bytes of a cut record), second from step "
              f"{resume}; {len(got)} tags x {len(got['loss'])} steps, one value each")


def main():
    global ARGS, tb_events
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", required=True, help="venv made by scripts/tensorboard-venv.sh")
    ap.add_argument("--cli", required=True, help="the latchkey CLI")
    ap.add_argument("--resume-steps", type=int, default=60)
    ARGS, rest = ap.parse_known_args()
    run_in_venv(ARGS.venv, "the TensorBoard test venv", "bash scripts/tensorboard-venv.sh")
    sys.path.insert(0, HERE)
    import tb_events as module

    tb_events = module
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
