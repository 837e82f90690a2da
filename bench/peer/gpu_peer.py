#!/usr/bin/env python3
"""The GPU benchmark peer: plain PyTorch eager GPTBigCode MQA training on one GPU (TP 1).

The same model and step as latchkey's (docs/model.md) written the way a competent PyTorch user
would on one GPU: fp32 master weights, bf16 compute (torch.autocast), fused causal attention
(torch.nn.functional.scaled_dot_product_attention, the single K/V head expanded to every query
head), tied input/output embeddings, gradient clipping by the global norm, torch.optim.AdamW
(foreach). Data: latchkey's synthetic source (docs/data.md), so both see the same tokens.

Prints one JSON line per step ({"step", "loss", "step_seconds", "tokens"}) and a last summary
line {"summary": {...}} with tokens_per_second (median of the measured steps), the model FLOPs
per token (6 N + 12 n_layer n_embd seq, N every parameter), the achieved TFLOPS, the peak it
divides by (dense bf16: 989 TFLOPS for H100/H200 SXM, or --peak-tflops) and MFU.

    python3 bench/peer/gpu_peer.py                        # ~350M params, seq 1024, on cuda
    python3 bench/peer/gpu_peer.py --cpu-dry-run          # a tiny model on the CPU, 2 steps
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from synthetic_data import synthetic_sample  # bench/peer/, the script's own folder

# Dense (no sparsity) bf16 tensor-core peaks, TFLOPS, by device-name substring.
PEAKS = [("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0), ("A10", 125.0)]


class Block(torch.nn.Module):
    def __init__(self, d, heads, eps=1e-5):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.ln_1 = torch.nn.LayerNorm(d, eps=eps)
        self.c_attn = torch.nn.Linear(d, d + 2 * self.hd)  # q (all heads) + one k + one v
        self.c_proj = torch.nn.Linear(d, d)
        self.ln_2 = torch.nn.LayerNorm(d, eps=eps)
        self.c_fc = torch.nn.Linear(d, 4 * d)
        self.mlp_proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split([d, self.hd, self.hd], dim=-1)
        q = q.view(b, s, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, 1, s, self.hd).expand(b, self.heads, s, self.hd)
        v = v.view(b, 1, s, self.hd).expand(b, self.heads, s, self.hd)
        if hasattr(F, "scaled_dot_product_attention"):  # torch 2.x: the fused kernels
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 (Debian's CPU torch, for --cpu-dry-run)
            w = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            w = w.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=x.device).tril(), -1e4)
            a = w.softmax(-1) @ v
        x = x + self.c_proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GptBigCode(torch.nn.Module):
    def __init__(self, layers, d, heads, vocab, positions):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(positions, d)
        self.h = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d, eps=1e-5)
        for p in self.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, ids, labels):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm_head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--embd", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--mb", type=int, default=8)
    p.add_argument("--gas", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--peak-tflops", type=float, default=0.0, help="0: by device name")
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny model on the CPU, 2 steps")
    a = p.parse_args(argv)
    if a.cpu_dry_run:
        a.layers, a.embd, a.heads, a.vocab, a.seq, a.mb, a.steps, a.warmup = 2, 64, 4, 256, 32, 2, 2, 1
    return a


def main(argv):
    a = parse_args(argv)
    if a.cpu_dry_run:
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device (torch.cuda.is_available() is False)"}))
        return 2
    else:
        dev = torch.device("cuda", 0)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(a.seed)
    model = GptBigCode(a.layers, a.embd, a.heads, a.vocab, a.seq).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, foreach=True)
    flops_per_token = 6 * n_params + 12 * a.layers * a.embd * a.seq
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = a.peak_tflops or next((t for k, t in PEAKS if k in name), 0.0)
    k = 0
    rates = []
    for step in range(a.steps):
        batches = []
        for _ in range(a.gas):
            rows = [synthetic_sample(a.seed, k + b, a.seq, a.vocab) for b in range(a.mb)]
            k += a.mb
            batches.append(torch.tensor(rows, dtype=torch.long))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0.0
        for tokens in batches:
            tokens = tokens.to(dev, non_blocking=True)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = model(tokens[:, :-1], tokens[:, 1:])
            (loss / a.gas).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tokens_step = a.mb * a.gas * a.seq
        if step >= a.warmup:
            rates.append(tokens_step / dt)
        print(json.dumps({"step": step, "loss": total / a.gas, "step_seconds": dt,
                          "tokens": tokens_step}), flush=True)
    tps = statistics.median(rates) if rates else 0.0
    achieved = tps * flops_per_token / 1e12
    print(json.dumps({"summary": {
        "device": name, "params": n_params, "layers": a.layers, "embd": a.embd,
        "heads": a.heads, "vocab": a.vocab, "seq": a.seq, "mb": a.mb, "gas": a.gas,
        "tokens_per_second": tps, "flops_per_token": flops_per_token,
        "achieved_tflops": achieved, "peak_tflops": peak,
        "mfu": achieved / peak if peak > 0 else None,
        "torch": torch.__version__, "loss_finite": all(math.isfinite(r) for r in rates)}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
