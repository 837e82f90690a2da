#!/usr/bin/env python3
"""The trace of a real `latchkey up` job (DP 2 x TP 2 on 4 workers, evaluation and asynchronous
checkpoints), written by `latchkey trace` and read back by HolisticTraceAnalysis's trace parser
(hta.common.trace.parse_trace_file, HolisticTraceAnalysis 0.5.0 from PyPI, tests/trace/
requirements.txt), which turns a PyTorch profiler trace into its events table:
  - every rank is a process, its streams threads (train, collectives, checkpoint), and the file
    carries distributedInfo with the world size;
  - per rank and step, the K/V all-reduce spans equal the step's kv_allreduce_calls in the
    rank's JSONL, and every rank has the step's window, its micro-batches (forward and backward
    each) and its boundary and optimizer spans;
  - within a thread spans nest or follow one another, never overlap partly;
  - the clocks of the ranks agree: no rank ends a collective before every member of its group
    instance began it, within the sum of the two ranks' stated clock errors (+ 2 us of
    rounding): max(begin) - min(end) <= err_a + err_b + 2 us, for every all-reduce;
  - `--steps A..B` keeps only those steps, and a job without trace files is NOT_FOUND (exit 4).

Runs inside the venv of scripts/trace-venv.sh; started with another interpreter it re-executes
itself with the venv's python. Without the venv it skips (exit 77) naming the command that makes
it; under CI=true it fails instead.
"""
import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from tool_venv import run_in_venv  # noqa: E402

ARGS = None
STEPS = 8
MICRO_BATCHES = 3


def spec():
    return {
        "model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
                  "vocab_size": 256, "n_positions": 64, "multi_query": True},
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": MICRO_BATCHES,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
        "tensor_parallel": {"autotp_size": 2},
        "managed_gradient_accumulation": True,
        "latchkey": {
            "seq_len": 32, "steps": STEPS, "world_size": 4, "kv_reduce": "coalesced",
            "data": {"synthetic": {"seed": 1}},
            "checkpoint": {"dir": "ckpt", "every_steps": 4, "keep": 2, "async": True},
            "eval": {"tokens_file": "eval.bin", "every_steps": 4, "samples": 2},
        },
    }


class TraceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="latchkey-trace-")
        cls.run_dir = os.path.join(cls.dir, "run")
        tokens = bytes(((i * 37) % 256) for i in range(4 * 32 + 1))
        with open(os.path.join(cls.dir, "eval.bin"), "wb") as f:
            f.write(b"".join(bytes([t, 0]) for t in tokens))  # uint16 little-endian
        spec_path = os.path.join(cls.dir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec(), f)
        cls.env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(cls.dir, "config"),
                       XDG_STATE_HOME=os.path.join(cls.dir, "state"))
        with open(os.path.join(cls.dir, "up.log"), "w") as log:
            proc = subprocess.Popen([ARGS.cli, "up", "--spec", spec_path, "--run-dir",
                                     cls.run_dir], env=cls.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=400)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "timeout"
        if rc != 0:
            with open(os.path.join(cls.dir, "up.log")) as f:
                raise AssertionError(f"latchkey up: {rc}\n{f.read()[-4000:]}")
        jobs = os.listdir(os.path.join(cls.run_dir, "jobs"))
        assert len(jobs) == 1, jobs
        cls.job = jobs[0]
        cls.records = os.path.join(cls.run_dir, "jobs", cls.job)
        cls.trace = os.path.join(cls.dir, "trace.json")
        out = cls.cli("trace", cls.job, "--run-dir", cls.run_dir, "-o", cls.trace)
        assert out.returncode == 0, out.stdout + out.stderr
        print(out.stdout.strip())
        cls.doc = json.load(open(cls.trace))
        cls.events = cls.parse_with_hta(cls.trace)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def cli(cls, *args):
        return subprocess.run([ARGS.cli, *args], env=cls.env, capture_output=True, text=True,
                              timeout=60)

    @staticmethod
    def parse_with_hta(path):
        """HTA's parser on the file; returns its events as dicts with names decoded."""
        from hta.common.trace import parse_trace_file
        from hta.configs.default_values import AttributeSpec, ValueType
        from hta.configs.parser_config import DEFAULT_PARSE_VERSION, ParserConfig

        cfg = ParserConfig.get_default_cfg()
        cfg.add_args([AttributeSpec(name, name, kind, default, DEFAULT_PARSE_VERSION)
                      for name, kind, default in (("step", ValueType.Int, -1),
                                                  ("micro_batch", ValueType.Int, -1),
                                                  ("kv", ValueType.Int, 0),
                                                  ("seq", ValueType.Int, 0),
                                                  ("bytes", ValueType.Int, 0),
                                                  ("op", ValueType.String, ""),
                                                  ("group", ValueType.String, ""))])
        meta, df, symbols = parse_trace_file(path, cfg)
        names = symbols.get_sym_table()
        rows = []
        for r in df.to_dict("records"):
            rows.append({"pid": int(r["pid"]), "tid": int(r["tid"]), "ts": int(r["ts"]),
                         "dur": int(r["dur"]), "end": int(r["end"]),
                         "name": names[int(r["name"])], "cat": names[int(r["cat"])],
                         "step": int(r["step"]), "kv": int(r.get("kv", 0) or 0),
                         "op": r.get("op"), "group": r.get("group"), "seq": r.get("seq")})
        return rows, meta

    def test_processes_threads_and_distributed_info(self):
        rows, meta = self.events
        self.assertEqual(sorted({r["pid"] for r in rows}), [0, 1, 2, 3])
        self.assertEqual(self.doc["distributedInfo"]["world_size"], 4)
        self.assertEqual(self.doc["distributedInfo"]["ranks"], [0, 1, 2, 3])
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in self.doc["traceEvents"]
                   if e.get("ph") == "M" and e["name"] == "thread_name"}
        self.assertEqual(threads[(0, 1)], "train")
        self.assertEqual(threads[(0, 2)], "collectives")
        self.assertEqual(threads[(0, 3)], "checkpoint")
        self.assertEqual(len(rows), sum(1 for e in self.doc["traceEvents"] if e["ph"] == "X"))
        # Asynchronous checkpoints: their writes on the checkpoint thread, after steps 3 and 7.
        writes = {(r["pid"], r["step"]) for r in rows if r["name"] == "checkpoint_write"}
        self.assertEqual(writes, {(p, s) for p in range(4) for s in (3, 7)})
        self.assertTrue(all(r["tid"] == 3 for r in rows if r["name"] == "checkpoint_write"))
        evals = {(r["pid"], r["step"]) for r in rows if r["name"] == "eval"}
        self.assertEqual(evals, {(p, s) for p in range(4) for s in (3, 7)})

    def test_kv_spans_per_step_equal_the_jsonl_counts(self):
        rows, _ = self.events
        kv = collections.Counter((r["pid"], r["step"]) for r in rows
                                 if r["cat"] == "collective" and r["kv"] == 1)
        compared = 0
        for rank in range(4):
            with open(os.path.join(self.records, f"steps-{rank}.jsonl")) as f:
                recs = [json.loads(l) for l in f if l.strip()]
            self.assertEqual([r["step"] for r in recs], list(range(STEPS)))
            for rec in recs:
                with self.subTest(rank=rank, step=rec["step"]):
                    self.assertEqual(kv[(rank, rec["step"])], rec["kv_allreduce_calls"])
                    compared += 1
                    per = collections.Counter(r["name"] for r in rows
                                              if r["pid"] == rank and r["step"] == rec["step"])
                    self.assertEqual(per[f"ProfilerStep#{rec['step']}"], 1)
                    self.assertEqual(per["forward"], MICRO_BATCHES)
                    self.assertEqual(per["backward"], MICRO_BATCHES)
                    self.assertEqual(per["boundary"], 1)
                    self.assertEqual(per["optimizer"], 1)
        self.assertEqual(compared, 4 * STEPS)
        self.assertGreater(sum(kv.values()), 0)  # TP 2: K/V reductions ran

    def test_spans_nest_within_each_thread(self):
        rows, _ = self.events
        by_thread = collections.defaultdict(list)
        for r in rows:
            by_thread[(r["pid"], r["tid"])].append(r)
        checked = 0
        for key, spans in by_thread.items():
            # Parents first: by start, the longer one first at a tie.
            spans.sort(key=lambda r: (r["ts"], -r["dur"]))
            stack = []
            for r in spans:
                while stack and stack[-1]["end"] <= r["ts"]:
                    stack.pop()
                if stack:
                    parent = stack[-1]
                    self.assertLessEqual(r["end"], parent["end"],
                                         f"{key}: {r['name']} (step {r['step']}, {r['ts']}.."
                                         f"{r['end']}) overlaps {parent['name']} "
                                         f"({parent['ts']}..{parent['end']})")
                stack.append(r)
                checked += 1
        self.assertEqual(checked, len(rows))

    def test_ranks_clocks_agree_on_every_all_reduce(self):
        rows, _ = self.events
        errors = {}
        for rank in range(4):
            with open(os.path.join(self.records, f"trace-{rank}.jsonl")) as f:
                header = json.loads(f.readline())
            self.assertEqual(header["clock"], "coordinator")
            self.assertGreaterEqual(header["clock_error_us"], 0)
            errors[rank] = header["clock_error_us"]
        tp = 2
        members = {"world": lambda r: 0, "tp": lambda r: r // tp, "dp": lambda r: r % tp}
        instances = collections.defaultdict(list)
        for r in rows:
            if r["cat"] != "collective" or r["op"] != "all_reduce":
                continue
            instances[(r["group"], members[r["group"]](r["pid"]), r["step"], r["seq"])].append(r)
        worst = None
        compared = 0
        for key, spans in instances.items():
            size = 4 if key[0] == "world" else 2
            self.assertEqual(len(spans), size, key)
            last_in = max(spans, key=lambda r: r["ts"])
            first_out = min(spans, key=lambda r: r["end"])
            bound = errors[last_in["pid"]] + errors[first_out["pid"]] + 2
            gap = last_in["ts"] - first_out["end"]
            self.assertLessEqual(gap, bound, f"{key}: rank {last_in['pid']} began "
                                 f"{gap} us after rank {first_out['pid']} ended (bound {bound})")
            worst = gap - bound if worst is None else max(worst, gap - bound)
            compared += 1
        self.assertGreater(compared, 4 * STEPS)
        print(f"{compared} all-reduce instances, clock errors (us) {errors}, the closest "
              f"{-worst} us inside the bound")

    def test_steps_filter_and_missing_trace(self):
        part = os.path.join(self.dir, "part.json")
        out = self.cli("--json", "trace", self.job, "--run-dir", self.run_dir, "--steps", "2..3",
                       "-o", part)
        self.assertEqual(out.returncode, 0, out.stderr)
        summary = json.loads(out.stdout)
        self.assertEqual((summary["first_step"], summary["last_step"]), (2, 3))
        steps = {e["args"]["step"] for e in json.load(open(part))["traceEvents"]
                 if e["ph"] == "X"}
        self.assertEqual(steps, {2, 3})
        empty = os.path.join(self.dir, "empty")
        os.makedirs(empty)
        out = self.cli("trace", self.job, "--run-dir", empty, "-o", part)
        self.assertEqual(out.returncode, 4, out.stderr)  # NOT_FOUND
        self.assertIn("no records of it", out.stderr)
        # A node agent's folder: the files directly in it, whatever ranks the node ran.
        node = os.path.join(self.dir, "node")
        os.makedirs(node)
        for rank in (2, 3):
            shutil.copy(os.path.join(self.records, f"trace-{rank}.jsonl"), node)
        out = self.cli("--json", "trace", self.job, "--run-dir", node, "-o", part)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout)["ranks"], 2)
        self.assertEqual(json.load(open(part))["distributedInfo"]["ranks"], [2, 3])


class LiveTraceTest(unittest.TestCase):
    """A running job's trace through its coordinator: `latchkey trace JOB` (no --run-dir) finds
    the live `up` run in the registry, asks its coordinator, and every rank answers with its
    heartbeat; the spans are those of the asked steps, with the JSONL's K/V counts."""

    def test_running_job_answers_through_the_coordinator(self):
        work = tempfile.mkdtemp(prefix="latchkey-trace-live-")
        self.addCleanup(shutil.rmtree, work, True)
        body = spec()
        body["latchkey"]["steps"] = 60
        del body["latchkey"]["checkpoint"], body["latchkey"]["eval"]
        spec_path = os.path.join(work, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(body, f)
        run = os.path.join(work, "run")
        env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(work, "config"),
                   XDG_STATE_HOME=os.path.join(work, "state"),
                   LATCHKEY_TEST_MIN_WINDOW_SECONDS="0.25")
        log = open(os.path.join(work, "up.log"), "w")
        up = subprocess.Popen([ARGS.cli, "up", "--spec", spec_path, "--run-dir", run], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def stop():
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
            log.close()
        self.addCleanup(stop)
        deadline = time.time() + 120
        records = None
        while time.time() < deadline:
            jobs = os.path.join(run, "jobs")
            if os.path.isdir(jobs) and os.listdir(jobs):
                records = os.path.join(jobs, os.listdir(jobs)[0])
                done = [l for l in open(os.path.join(records, "steps-3.jsonl"))] \
                    if os.path.exists(os.path.join(records, "steps-3.jsonl")) else []
                if len(done) >= 5:
                    break
            self.assertIsNone(up.poll(), open(os.path.join(work, "up.log")).read()[-3000:])
            time.sleep(0.2)
        else:
            self.fail("the job did not reach step 5")
        job = os.path.basename(records)
        out_path = os.path.join(work, "live.json")
        got = subprocess.run([ARGS.cli, "--json", "trace", job, "--steps", "2..3", "-o", out_path],
                             env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(got.returncode, 0, got.stderr)
        self.assertIsNone(up.poll(), "the job ended before the trace was taken")
        summary = json.loads(got.stdout)
        self.assertEqual(summary["ranks"], 4)
        self.assertEqual((summary["first_step"], summary["last_step"]), (2, 3))
        self.assertGreaterEqual(summary["clock_error_us"], 0)
        rows, _ = TraceTest.parse_with_hta(out_path)
        self.assertEqual({r["step"] for r in rows}, {2, 3})
        for rank in range(4):
            recs = {r["step"]: r for r in map(json.loads, open(
                os.path.join(records, f"steps-{rank}.jsonl")))}
            for step in (2, 3):
                kv = sum(1 for r in rows if r["pid"] == rank and r["step"] == step
                         and r["cat"] == "collective" and r["kv"] == 1)
                self.assertEqual(kv, recs[step]["kv_allreduce_calls"], (rank, step))
                self.assertEqual(sum(1 for r in rows if r["pid"] == rank and
                                     r["name"] == f"ProfilerStep#{step}"), 1)
        print(f"live: {summary['events']} spans of 4 ranks for steps 2..3, clock within "
              f"{summary['clock_error_us']} us")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", required=True)
    ap.add_argument("--cli", required=True)
    ARGS, rest = ap.parse_known_args()
    run_in_venv(ARGS.venv, "the trace test venv", "bash scripts/trace-venv.sh")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
