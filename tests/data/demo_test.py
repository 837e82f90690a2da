#!/usr/bin/env python3
"""scripts/demo.sh end to end on a short run: it trains the BPE on the repository's sources,
writes the Megatron dataset whose validation split is exactly the held-out files, and `latchkey
up` trains examples/demo.json's model on it (steps shortened) with the job succeeding, finite
losses that go down and an eval loss, and TensorBoard (the venv of scripts/tensorboard-venv.sh)
reads the run's RUN/tensorboard with the JSONL's tags and values; a second run reuses the cached
data without tokenizing.

Needs the venv of scripts/hf-venv.sh (tokenizers): fails naming the command when it is missing,
never skips.
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = None
STEPS = 12


def idx_counts(prefix):
    with open(prefix + ".idx", "rb") as f:
        head = f.read(34)
    assert head[:9] == b"MMIDIDX\x00\x00"
    return head[17], struct.unpack_from("<QQ", head, 18)


class DemoTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="latchkey-demo-")
        self.run_dir = os.path.join(self.tmp, "run")
        with open(os.path.join(ROOT, "examples", "demo.json")) as f:
            spec = json.load(f)
        self.vocab = spec["model"]["vocab_size"]
        # The demo's spec, shortened: fewer steps, an evaluation every 4, files under tmp.
        spec["scheduler"]["params"]["total_num_steps"] = STEPS
        lk = spec["latchkey"]
        lk["steps"] = STEPS
        lk["data"]["path_prefix"] = os.path.join(self.run_dir, "data", "corpus")
        lk["eval"]["every_steps"] = 4
        lk["checkpoint"]["dir"] = os.path.join(self.run_dir, "checkpoints")
        self.spec = os.path.join(self.tmp, "demo.json")
        with open(self.spec, "w") as f:
            json.dump(spec, f)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def demo(self):
        env = dict(os.environ, LATCHKEY_DEMO_SPEC=self.spec, LATCHKEY_DEMO_RUN_DIR=self.run_dir,
                   LATCHKEY_DEMO_BUILD="0", LATCHKEY_BUILD_DIR=ARGS.build,
                   LATCHKEY_HF_VENV=ARGS.venv, XDG_STATE_HOME=os.path.join(self.tmp, "state"))
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "demo.sh")], env=env,
                           capture_output=True, text=True, timeout=500)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-4000:])
        return r.stdout + r.stderr

    def steps(self):
        with open(os.path.join(self.run_dir, "steps-0.jsonl")) as f:
            return [json.loads(l) for l in f if l.strip()]

    def check_tensorboard(self, steps):
        """TensorBoard's EventAccumulator on RUN/tensorboard: the JSONL's tags, steps and
        values (float32)."""
        tb = os.path.join(self.run_dir, "tensorboard")
        python = os.path.join(ARGS.tensorboard_venv, "bin", "python")
        if not os.path.exists(python):
            why = (f"no TensorBoard venv at {ARGS.tensorboard_venv} (scripts/tensorboard-venv.sh"
                   f" {ARGS.tensorboard_venv}): RUN/tensorboard not read")
            if os.environ.get("CI") == "true":
                self.fail(why)
            print("demo_test: " + why, file=sys.stderr)
            return
        r = subprocess.run([python, os.path.join(ROOT, "tests", "tensorboard", "tb_events.py"),
                            tb], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        got = {t: [tuple(p) for p in v] for t, v in json.loads(r.stdout).items()}
        tags = ("loss", "eval_loss", "lr", "grad_norm", "tokens_per_second", "step_seconds",
                "kv_allreduce_calls", "collective_share", "checkpoint_seconds",
                "peak_memory_bytes")
        want = {}
        for rec in steps:
            for t in tags:
                if t in rec:
                    f32 = struct.unpack("<f", struct.pack("<f", rec[t]))[0]
                    want.setdefault(t, []).append((rec["step"], f32))
        self.assertEqual(sorted(got), sorted(want))
        self.assertLessEqual({"loss", "eval_loss", "lr", "tokens_per_second"}, set(got))
        for t in want:
            self.assertEqual(got[t], want[t], t)

    def test_demo_trains_on_the_bpe_dataset_and_caches_it(self):
        out = self.demo()
        self.assertIn("training a byte-level BPE", out)
        prefix = os.path.join(self.run_dir, "data", "corpus")
        with open(prefix + ".tokenizer.json") as f:
            tok = json.load(f)
        self.assertLessEqual(len(tok["model"]["vocab"]), self.vocab)
        self.assertGreater(len(tok["model"]["vocab"]), 1000)  # a BPE, not bytes
        code, (sequences, documents) = idx_counts(prefix)
        self.assertEqual(code, 8)  # uint16
        line = next(l for l in out.splitlines() if l.startswith("demo: corpus:"))
        words = line.split()
        nt, nh = int(words[2]), int(words[6])
        self.assertEqual(sequences, nt + nh)
        self.assertEqual(documents, nt + nh + 1)
        # The spec's split puts exactly the held-out files into the validation split.
        self.assertEqual(round(0.85 * (nt + nh)), nt)
        self.assertGreater(nh, 0)
        steps = self.steps()
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))
        losses = [s["loss"] for s in steps]
        self.assertTrue(all(math.isfinite(x) for x in losses), losses)
        self.assertLess(sum(losses[-3:]) / 3, sum(losses[:3]) / 3 - 0.5, losses)
        evals = [s["eval_loss"] for s in steps if "eval_loss" in s]
        self.assertEqual(len(evals), STEPS // 4, steps)
        self.assertTrue(all(math.isfinite(x) for x in evals), evals)
        self.assertLess(evals[-1], evals[0])
        self.check_tensorboard(steps)
        self.assertIn("summary (rank 0)", out)
        self.assertIn("eval loss first -> final", out)
        self.assertIn("demo: build ", out)
        # Again: the data comes from the cache, byte for byte the same files.
        before = {e: os.stat(prefix + e).st_mtime_ns for e in (".bin", ".idx", ".tokenizer.json")}
        out = self.demo()
        self.assertIn("cached", out)
        self.assertNotIn("training a byte-level BPE", out)
        after = {e: os.stat(prefix + e).st_mtime_ns for e in before}
        self.assertEqual(before, after)
        self.assertEqual(len(self.steps()), STEPS)

    def test_up_puts_the_index_cache_under_the_run_when_the_data_folder_is_read_only(self):
        # A tiny dataset in a folder the user running `up` cannot write (root: run up as nobody).
        data = os.path.join(self.tmp, "ro-data")
        os.makedirs(data)
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import prepare_data

        w = prepare_data.IndexedDatasetWriter(os.path.join(data, "corpus"), "uint16")
        for d in range(40):
            w.add_item([(d * 7 + i) % 300 + 1 for i in range(50 + d)] + [0])
            w.end_document()
        w.finalize()
        run = os.path.join(self.tmp, "ro-run")
        os.makedirs(run)
        with open(self.spec) as f:
            spec = json.load(f)
        spec["scheduler"]["params"]["total_num_steps"] = 2
        spec["latchkey"].update(steps=2)
        spec["latchkey"]["data"]["path_prefix"] = os.path.join(data, "corpus")
        spec["latchkey"]["eval"]["every_steps"] = 2
        del spec["latchkey"]["checkpoint"]
        spec_path = os.path.join(run, "spec-in.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        cmd = [os.path.join(ARGS.build, "client", "latchkey"), "up", "--spec", spec_path,
               "--run-dir", os.path.join(run, "run")]
        env = dict(os.environ, HOME=run, XDG_STATE_HOME=os.path.join(run, "state"))
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                self.fail("setpriv (util-linux) is needed to run up as another user")
            for p in (self.tmp, run):
                os.chmod(p, 0o755)
            os.chown(run, 65534, 65534)
            os.chown(spec_path, 65534, 65534)
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        else:
            os.chmod(data, 0o555)
        self.assertFalse(os.access(data, os.W_OK) and os.geteuid() != 0)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        with open(os.path.join(run, "run", "spec.json")) as f:
            submitted = json.load(f)
        cache = os.path.join(run, "run", "index-cache")
        self.assertEqual(submitted["latchkey"]["data"]["cache_dir"], cache)
        self.assertTrue(any(n.endswith(".lkidx") for n in os.listdir(cache)), os.listdir(cache))
        self.assertEqual(sorted(os.listdir(data)), ["corpus.bin", "corpus.idx"])


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", default=os.path.join(ROOT, "build", "hf-venv"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--tensorboard-venv", default=os.path.join(ROOT, "build", "tensorboard-venv"))
    ARGS, rest = ap.parse_known_args()
    if not os.path.exists(os.path.join(ARGS.venv, "bin", "python")):
        sys.exit(f"demo_test: no venv at {ARGS.venv}: run scripts/hf-venv.sh {ARGS.venv}")
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
