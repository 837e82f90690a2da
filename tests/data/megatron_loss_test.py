#!/usr/bin/env python3
"""A DP 2 x TP 2 run on a Megatron dataset trains on exactly megatron-core's samples, and its
step-0 loss equals an independent float64 forward of those samples.

Four latchkey-worker ranks start from the tiny fixture checkpoint (testdata/gptbigcode-tiny/mqa)
on testdata/megatron/c_uint8 (seq_len 7, split 90,5,5, seed 1234, 54 samples: the oracle case
"c_uint8-s7-n54") with --dump-samples. The dumps must be the oracle's samples at the positions
of docs/data.md, and the reported loss of step 0 must equal, within 1e-5, the mean token cross
entropy that Hugging Face transformers' GPTBigCode computes in float64 on the oracle's samples
0..7 (the whole first global batch: DP 2 x GAS 2 x MB 2).

Runs in the venv of scripts/hf-venv.sh (transformers); started with another python it
re-executes itself there, and fails naming the command to run when the venv is missing.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = 1e-5
DP, TP, MB, GAS, SEQ = 2, 2, 2, 2, 7


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(worker, work):
    spec = {
        "model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
                  "vocab_size": 256, "n_positions": 64, "multi_query": True},
        "train_micro_batch_size_per_gpu": MB,
        "gradient_accumulation_steps": GAS,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "tensor_parallel": {"autotp_size": TP},
        "latchkey": {
            "seq_len": SEQ, "steps": 1, "seed": 1, "world_size": DP * TP,
            "init_from": os.path.join(ROOT, "testdata", "gptbigcode-tiny", "mqa"),
            "data": {"format": "megatron",
                     "path_prefix": os.path.join(ROOT, "testdata", "megatron", "c_uint8"),
                     "split": "90,5,5", "seed": 1234, "num_samples": 54,
                     "cache_dir": os.path.join(work, "cache")},
        },
    }
    spec_path = os.path.join(work, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port = free_port()
    procs = []
    for rank in range(DP * TP):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(DP * TP),
                   LOCAL_WORLD_SIZE=str(DP * TP), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        err = open(os.path.join(work, f"stderr-{rank}.txt"), "w")
        cmd = [worker, "--standalone", "--spec", spec_path, "--metrics-jsonl",
               os.path.join(work, "steps-{rank}.jsonl"), "--quiet",
               "--dump-samples", os.path.join(work, "dump"), str(GAS)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=err, stderr=err), err))
    for rank, (p, err) in enumerate(procs):
        try:
            code = p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            code = p.wait()
        err.close()
        if code != 0:
            with open(os.path.join(work, f"stderr-{rank}.txt")) as f:
                sys.exit(f"FAIL: rank {rank} exit {code}: {f.read()}")
    with open(os.path.join(work, "steps-0.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", default=os.path.join(ROOT, "build", "hf-venv"))
    ap.add_argument("--worker", required=True)
    args = ap.parse_args()
    venv = os.path.abspath(args.venv)
    if os.path.abspath(sys.prefix) != venv:
        py = os.path.join(venv, "bin", "python")
        if not os.access(py, os.X_OK):
            sys.exit(f"FAIL: no venv at {venv}: run `bash scripts/hf-venv.sh {venv}`")
        os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])

    import torch
    from transformers import GPTBigCodeForCausalLM

    with open(os.path.join(ROOT, "testdata", "megatron", "expected.json")) as f:
        oracle = next(c for c in json.load(f)["cases"] if c["name"] == "c_uint8-s7-n54")
    expected = oracle["train"]["tokens"]
    with tempfile.TemporaryDirectory() as work:
        steps = run(args.worker, work)
        for rank in range(DP * TP):
            with open(os.path.join(work, f"dump.rank{rank}")) as f:
                lines = [json.loads(l) for l in f]
            assert len(lines) == GAS, lines
            for line in lines:
                d, m = line["dp_rank"], line["micro_batch"]
                for b in range(MB):
                    p = (m * DP + d) * MB + b
                    assert line["positions"][b] == p, line
                    assert line["tokens"][b] == expected[p], (rank, p, line["tokens"][b])
    print(f"dumps: the {DP * TP} ranks read megatron-core's samples 0..{DP * GAS * MB - 1}")
    model = GPTBigCodeForCausalLM.from_pretrained(
        os.path.join(ROOT, "testdata", "gptbigcode-tiny", "mqa")).double().eval()
    batch = torch.tensor(expected[: DP * GAS * MB], dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=batch[:, :-1]).logits
        ref = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).item()
    loss = steps[0]["loss"]
    diff = abs(loss - ref)
    print(f"step 0 loss: latchkey {loss:.9f} float64 transformers {ref:.9f} |diff| {diff:.2e}")
    if diff > TOLERANCE:
        sys.exit(f"FAIL: |diff| {diff} > {TOLERANCE}")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
