#!/usr/bin/env python3
"""scripts/prepare-data: its writer's bytes equal megatron-core's IndexedDatasetBuilder's (the
oracle datasets of testdata/megatron were written by it), a byte-level BPE trained on text and
JSONL round-trips every document with EOD appended, and latchkey-worker trains on the output.

Runs in the venv of scripts/hf-venv.sh (tokenizers); started with another python it re-executes
itself there, and fails naming the command to run when the venv is missing.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
ARGS = None


def read_indexed(prefix):
    """(dtype code, sequences as id lists, document indices) of a Megatron .idx/.bin pair."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", idx, 9)
    assert version == 1
    code = idx[17]
    n, nd = struct.unpack_from("<QQ", idx, 18)
    lengths = struct.unpack_from("<%di" % n, idx, 34)
    pointers = struct.unpack_from("<%dq" % n, idx, 34 + 4 * n)
    docs = struct.unpack_from("<%dq" % nd, idx, 34 + 12 * n)
    fmt = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}[code]
    size = struct.calcsize(fmt)
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    seqs = [list(struct.unpack_from("<%d%s" % (l, fmt), data, p)) for l, p in zip(lengths, pointers)]
    assert len(data) == sum(lengths) * size
    return code, seqs, list(docs)


class PrepareDataTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_writer_bytes_equal_megatron_core_builder(self):
        import prepare_data

        names = {1: "uint8", 4: "int32", 8: "uint16"}
        for name in ("a_uint16", "b_int32", "c_uint8"):
            prefix = os.path.join(ROOT, "testdata", "megatron", name)
            code, seqs, docs = read_indexed(prefix)
            out = os.path.join(self.dir, name)
            w = prepare_data.IndexedDatasetWriter(out, names[code])
            it = iter(seqs)
            for begin, end in zip(docs, docs[1:]):
                for _ in range(end - begin):
                    w.add_item(next(it))
                w.end_document()
            w.finalize()
            for ext in (".bin", ".idx"):
                with open(prefix + ext, "rb") as a, open(out + ext, "rb") as b:
                    self.assertEqual(a.read(), b.read(), name + ext)

    def run_tool(self, *args):
        return subprocess.run(
            [sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"), *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def write_inputs(self):
        texts = [
            "def add(a, b):\n    return a + b\n" * 20,
            "The quick brown fox jumps over the lazy dog. " * 30,
            "héllo wörld ✓ — bytes that are not ASCII\n" * 10,
        ]
        paths = []
        for i, t in enumerate(texts):
            p = os.path.join(self.dir, f"doc{i}.txt")
            with open(p, "w", encoding="utf-8") as f:
                f.write(t)
            paths.append(p)
        jsonl = os.path.join(self.dir, "docs.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t, "id": 1}) + "\n")
        return texts, paths, jsonl

    def test_train_bpe_text_and_jsonl(self):
        from tokenizers import Tokenizer

        texts, paths, jsonl = self.write_inputs()
        prefix = os.path.join(self.dir, "corpus")
        self.run_tool("--train-bpe", "400", "--output-prefix", prefix, *paths)
        tok = Tokenizer.from_file(prefix + ".tokenizer.json")
        eod = tok.token_to_id("<|endoftext|>")
        self.assertEqual(eod, 0)
        self.assertLessEqual(tok.get_vocab_size(), 400)
        self.assertGreater(tok.get_vocab_size(), 257)  # merges were learned
        code, seqs, docs = read_indexed(prefix)
        self.assertEqual(code, 8)  # uint16: Megatron's optimal dtype below 65500
        self.assertEqual(docs, [0, 1, 2, 3])
        for text, ids in zip(texts, seqs):
            self.assertEqual(ids[-1], eod)
            self.assertNotIn(eod, ids[:-1])
            self.assertEqual(tok.decode(ids[:-1]), text)
        self.assertLess(sum(map(len, seqs)), sum(len(t.encode()) for t in texts))  # BPE merges
        # The saved tokenizer on the same documents as JSONL: the same files, byte for byte.
        again = os.path.join(self.dir, "again")
        self.run_tool(
            "--tokenizer", prefix + ".tokenizer.json", "--json-key", "text",
            "--output-prefix", again, jsonl,
        )
        for ext in (".bin", ".idx"):
            with open(prefix + ext, "rb") as a, open(again + ext, "rb") as b:
                self.assertEqual(a.read(), b.read(), ext)

    def test_refusals(self):
        _, paths, jsonl = self.write_inputs()
        trained = os.path.join(self.dir, "t")
        self.run_tool("--train-bpe", "300", "--output-prefix", trained, paths[0])
        for args in (
            ["--train-bpe", "100", "--output-prefix", os.path.join(self.dir, "x"), paths[0]],
            ["--tokenizer", trained + ".tokenizer.json", "--eod-token", "<eos>",
             "--output-prefix", os.path.join(self.dir, "x"), paths[0]],
            ["--train-bpe", "300", "--json-key", "body", "--output-prefix",
             os.path.join(self.dir, "x"), jsonl],
        ):
            r = subprocess.run(
                [sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"), *args],
                capture_output=True, text=True,
            )
            self.assertNotEqual(r.returncode, 0, args)

    def test_worker_trains_on_the_output(self):
        if not ARGS.worker:
            self.skipTest("no --worker")
        _, paths, _ = self.write_inputs()
        prefix = os.path.join(self.dir, "corpus")
        self.run_tool("--train-bpe", "320", "--output-prefix", prefix, *paths)
        spec = {
            "model": {"model_type": "gpt_bigcode", "n_layer": 1, "n_embd": 32, "n_head": 4,
                      "vocab_size": 320, "n_positions": 32, "multi_query": True},
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
            "latchkey": {"seq_len": 16, "steps": 3, "seed": 1,
                         "data": {"format": "megatron", "path_prefix": prefix,
                                  "split": "2,1,0"},
                         "eval": {"split": "validation", "every_steps": 3, "samples": 2}},
        }
        spec_path = os.path.join(self.dir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        jsonl = os.path.join(self.dir, "steps.jsonl")
        r = subprocess.run(
            [ARGS.worker, "--standalone", "--spec", spec_path, "--metrics-jsonl", jsonl,
             "--quiet"],
            capture_output=True, text=True, timeout=300,
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(jsonl) as f:
            steps = [json.loads(l) for l in f if l.strip()]
        self.assertEqual(len(steps), 3)
        self.assertIn("eval_loss", steps[-1])


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", default=os.path.join(ROOT, "build", "hf-venv"))
    ap.add_argument("--worker", default="")
    ARGS, rest = ap.parse_known_args()
    py = os.path.join(ARGS.venv, "bin", "python")
    if os.path.realpath(sys.prefix) != os.path.realpath(ARGS.venv):
        if not os.path.exists(py):
            sys.exit(f"prepare_data_test: no venv at {ARGS.venv}: run scripts/hf-venv.sh {ARGS.venv}")
        os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
