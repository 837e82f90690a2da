#!/usr/bin/python3
"""The Hugging Face round trip, with the real transformers GPTBigCodeForCausalLM.

1. latchkey -> transformers: a tiny GPTBigCode (MQA and MHA) trained for a few steps by
   `latchkey-worker --standalone` at TP 2 and saved with `--save DIR` loads with
   `GPTBigCodeForCausalLM.from_pretrained(DIR)`; its loss on known samples equals the step-0
   loss latchkey reports when it starts from DIR (`latchkey.init_from`), within 1e-5.
3. checkpoint -> transformers: `latchkey checkpoint export STEP_DIR --hf OUT` of a resumable
   checkpoint written at TP 2 (latchkey-checkpoint/2, pieces in logical index space) loads with
   `from_pretrained(OUT)`, and its loss on the samples of the next window equals the loss
   latchkey reported for that window (computed with the checkpoint's weights), within 1e-5.
2. transformers -> latchkey: a GPTBigCodeForCausalLM built from a GPTBigCodeConfig (n_inner
   None, transformers' own extra keys) and written with `save_pretrained(DIR,
   safe_serialization=True)` starts latchkey (`latchkey.init_from: DIR`); latchkey's step-0 loss
   equals transformers' loss on the same samples within 1e-5.

Samples follow docs/data.md: sample k is tokens[k*S : k*S + S + 1]; with MB samples per
micro-batch, GAS 1 and DP 1, step 0 reads samples 0..MB-1, and its `loss` is the mean token
cross entropy over them.

Runs inside the venv of scripts/hf-venv.sh (tests/hf/requirements.txt); started with another
interpreter it re-executes itself with the venv's python, and fails if the venv is missing.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from tool_venv import run_in_venv  # noqa: E402

SEQ_LEN = 32
MICRO_BATCH = 4
TOLERANCE = 1e-5
# Per tensor: max |latchkey - transformers| / max |transformers| (float32 on both sides).
GRAD_TOLERANCE = 1e-5


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", required=True, help="latchkey-worker binary")
    p.add_argument("--venv", required=True, help="venv made by scripts/hf-venv.sh")
    p.add_argument("--tokens", required=True, help="uint16 token file, vocab 256")
    p.add_argument("--cli", help="latchkey CLI binary (checkpoint export); absent: part 3 is "
                                 "skipped (a build without the CLI)")
    args = p.parse_args()
    args.worker, args.tokens = os.path.abspath(args.worker), os.path.abspath(args.tokens)
    if args.cli:
        args.cli = os.path.abspath(args.cli)
    return args


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_json(multi_query):
    return {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
            "vocab_size": 256, "n_positions": 64, "multi_query": multi_query}


def spec(model, tokens, tp, steps, lr, init_from=None):
    s = {
        "model": model,
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "SGD", "params": {"lr": lr}},
        "tensor_parallel": {"autotp_size": tp},
        "latchkey": {"seq_len": SEQ_LEN, "steps": steps, "seed": 7, "world_size": tp,
                     "data": {"tokens_file": tokens, "dtype": "uint16"}},
    }
    if init_from:
        s["latchkey"]["init_from"] = init_from
    return s


def run_workers(work, name, job, extra_args=()):
    """Runs job's world_size standalone ranks; returns rank 0's JSONL records."""
    run_dir = os.path.join(work, name)
    os.makedirs(run_dir)
    spec_path = os.path.join(run_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(job, f, indent=2)
    world = job["latchkey"]["world_size"]
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        cmd = [ARGS.worker, "--standalone", "--spec", spec_path, "--metrics-jsonl",
               os.path.join(run_dir, "steps-{rank}.jsonl"), "--quiet", *extra_args]
        err = open(os.path.join(run_dir, f"stderr-{rank}.txt"), "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=err, stderr=err), err))
    failed = []
    for rank, (proc, err) in enumerate(procs):
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        err.close()
        if code != 0:
            with open(os.path.join(run_dir, f"stderr-{rank}.txt")) as f:
                failed.append(f"rank {rank} exit {code}: {f.read()}")
    if failed:
        raise AssertionError(f"{name}: latchkey-worker failed\n" + "\n".join(failed))
    with open(os.path.join(run_dir, "steps-0.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def samples(count, first=0):
    import numpy as np
    import torch
    tokens = np.fromfile(ARGS.tokens, dtype="<u2").astype(np.int64)
    rows = [tokens[k * SEQ_LEN:k * SEQ_LEN + SEQ_LEN + 1] for k in range(first, first + count)]
    return torch.from_numpy(np.stack(rows))


def hf_loss(model, batch):
    """transformers' mean token cross entropy of `batch` ([B, S+1] token ids), eval mode."""
    import torch
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch[:, :-1]).logits
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).double(), batch[:, 1:].reshape(-1)).item()


def latchkey_step0_loss(work, name, model, ckpt, tp):
    """latchkey's reported loss of step 0 when it starts from `ckpt` (SGD, one step)."""
    steps = run_workers(work, name, spec(model, ARGS.tokens, tp, 1, 1e-9, init_from=ckpt))
    assert len(steps) == 1 and steps[0]["step"] == 0, steps
    return steps[0]["loss"]


def check_close(what, latchkey, transformers_value):
    diff = abs(latchkey - transformers_value)
    print(f"{what}: latchkey {latchkey:.9f} transformers {transformers_value:.9f} "
          f"|diff| {diff:.2e}")
    assert diff <= TOLERANCE, f"{what}: |diff| {diff} > {TOLERANCE}"


def latchkey_to_transformers(work, multi_query):
    from transformers import GPTBigCodeForCausalLM
    tag = "mqa" if multi_query else "mha"
    model = model_json(multi_query)
    saved = os.path.join(work, f"{tag}-latchkey-saved")
    trained = run_workers(work, f"{tag}-train", spec(model, ARGS.tokens, 2, 3, 0.05),
                          ["--save", saved])
    assert [r["step"] for r in trained] == [0, 1, 2], trained
    hf = GPTBigCodeForCausalLM.from_pretrained(saved)
    assert hf.config.multi_query == multi_query
    assert hf.transformer.h[0].attn.c_attn.weight.shape[0] == (
        64 + 2 * (8 if multi_query else 64))
    # lm_head is tied, as latchkey writes it.
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()
    reference = hf_loss(hf, samples(MICRO_BATCH))
    ours = latchkey_step0_loss(work, f"{tag}-resume", model, saved, 2)
    check_close(f"{tag} latchkey-saved checkpoint, loss of samples 0..3", ours, reference)


def checkpoint_to_transformers(work, multi_query):
    from transformers import GPTBigCodeForCausalLM
    tag = "mqa" if multi_query else "mha"
    job = spec(model_json(multi_query), ARGS.tokens, 2, 4, 0.05)
    run_dir = os.path.join(work, f"{tag}-ckpt-train")
    job["latchkey"]["checkpoint"] = {"dir": os.path.join(run_dir, "ckpt"), "every_steps": 2}
    trained = run_workers(work, f"{tag}-ckpt-train", job)
    assert [r["step"] for r in trained] == [0, 1, 2, 3], trained
    step_dir = os.path.join(run_dir, "ckpt", "step-00000001")
    out = os.path.join(work, f"{tag}-exported")
    result = subprocess.run([ARGS.cli, "checkpoint", "export", step_dir, "--hf", out],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"checkpoint export: {result.returncode}: {result.stderr}"
    with open(os.path.join(step_dir, "manifest.json")) as f:
        assert json.load(f)["format"] == "latchkey-checkpoint/2"
    hf = GPTBigCodeForCausalLM.from_pretrained(out)
    assert hf.config.multi_query == multi_query
    # Window 2 (GAS 1, DP 1) reads samples 8..11 with the weights after step 1.
    reference = hf_loss(hf, samples(MICRO_BATCH, first=2 * MICRO_BATCH))
    check_close(f"{tag} exported checkpoint step-00000001, loss of window 2", trained[2]["loss"],
                reference)


def transformers_to_latchkey(work, multi_query):
    import torch
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM
    tag = "mqa" if multi_query else "mha"
    torch.manual_seed(11 if multi_query else 12)
    config = GPTBigCodeConfig(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=8,
                              n_inner=None, multi_query=multi_query)
    hf = GPTBigCodeForCausalLM(config)
    with torch.no_grad():
        # Move every parameter (LayerNorm weights 1 and biases 0 included) away from its
        # initial value, so a reader that ignored one of them would change the loss.
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    saved = os.path.join(work, f"{tag}-transformers-saved")
    hf.save_pretrained(saved, safe_serialization=True)
    with open(os.path.join(saved, "config.json")) as f:
        written = json.load(f)
    assert written["n_inner"] is None and "transformers_version" in written, written
    assert os.path.exists(os.path.join(saved, "model.safetensors")), os.listdir(saved)
    reference = hf_loss(hf, samples(MICRO_BATCH))
    ours = latchkey_step0_loss(work, f"{tag}-from-transformers", model_json(multi_query),
                               saved, 2)
    check_close(f"{tag} transformers-saved checkpoint, loss of samples 0..3", ours, reference)
    check_gradients(work, tag, hf, saved, model_json(multi_query))


def check_gradients(work, tag, hf, ckpt, model):
    """Every parameter's step-0 gradient: latchkey's --dump-grads (TP 1, full shapes) against
    torch autograd through transformers' model on the same samples."""
    import torch
    from safetensors.torch import load_file
    dump = os.path.join(work, f"{tag}-grads")
    run_workers(work, f"{tag}-grads-run", spec(model, ARGS.tokens, 1, 1, 1e-9, init_from=ckpt),
                ["--dump-grads", dump, "--dump-grads-step", "0"])
    ours = load_file(os.path.join(dump, "grads-rank0.safetensors"))
    hf.eval()
    hf.zero_grad()
    batch = samples(MICRO_BATCH)
    logits = hf(input_ids=batch[:, :-1]).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                      batch[:, 1:].reshape(-1)).backward()
    named = dict(hf.named_parameters())
    assert sorted(ours) == sorted(named), (sorted(ours), sorted(named))
    worst = 0.0
    for name, p in named.items():
        g = ours[name].double()
        ref = p.grad.double()
        assert g.shape == ref.shape, (name, g.shape, ref.shape)
        err = ((g - ref).abs().max() / ref.abs().max().clamp(min=1e-12)).item()
        worst = max(worst, err)
        assert err <= GRAD_TOLERANCE, f"{tag} gradient of {name}: relative max error {err}"
    print(f"{tag} step-0 gradients of {len(named)} tensors: worst relative max error "
          f"{worst:.2e}")


def main():
    import torch
    import transformers
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory(prefix="latchkey-hf-") as work:
        for multi_query in (True, False):
            latchkey_to_transformers(work, multi_query)
            if ARGS.cli:
                checkpoint_to_transformers(work, multi_query)
            else:
                print("no --cli: checkpoint export not checked (a build without the CLI)")
            transformers_to_latchkey(work, multi_query)
    print("PASS")


if __name__ == "__main__":
    ARGS = parse_args()
    run_in_venv(ARGS.venv, "the Hugging Face test venv", "bash scripts/hf-venv.sh",
                missing_skips=False)
    main()
