#!/usr/bin/python3
"""The benchmark peer: plain PyTorch eager + torch.distributed (Gloo) tensor parallelism.

The same GPTBigCode multi-query-attention model and training step as latchkey
(docs/model.md), written the way a competent PyTorch user would write it, so the end-to-end
benchmark (bench/tokens_vs_peer.py) compares latchkey against a fair baseline:

- Megatron-style TP: c_attn and mlp.c_fc column-parallel (identity forward, all-reduce of the
  input gradient backward), attn.c_proj and mlp.c_proj row-parallel (in-place all-reduce of
  the output forward, identity backward), their biases added once after the reduction;
- MQA: every TP rank holds the whole K/V projection and only its own query heads; the K/V
  gradient of every layer is flattened into one buffer and all-reduced once per window
  (latchkey's "coalesced" K/V mode);
- attention as latchkey computes it on the CPU: matmul, scale, the cached causal mask applied
  in place (masked_fill_ on the fresh scores, which nothing saved for backward), softmax,
  matmul (PyTorch 1.13 has no scaled_dot_product_attention);
- gradient accumulation over GAS micro-batches (backward of loss / GAS), then the exact global
  gradient norm: clip_grad_norm_'s per-tensor norms (torch._foreach_norm, on the fp32
  gradients themselves, no copies) squared and summed in float64, one float64 scalar
  all-reduce (latchkey sums fp32 squares into a float64 accumulator and all-reduces the same
  scalar; the fp32 per-tensor norms put the peer's about 3e-5 relative from it at the larger
  shapes), clipping, torch.optim.AdamW (foreach);
- latchkey's allocator settings: its worker calls mallopt (worker/train/threads.cc: blocks up
  to 32 MiB from the heap, no trim, 16 MiB top pad) so freed activations are not returned to
  the kernel between micro-batches; the ranks started here get the same through glibc's
  tunables (MALLOC_TUNABLES, unless GLIBC_TUNABLES is already set);
- the same initial weights (the full model drawn tensor by tensor from one generator seeded
  with --seed, sharded after) and the same synthetic samples (docs/data.md), so the loss
  trajectory can be compared with latchkey's.

Usage (Debian's interpreter: it sees python3-torch):
    /usr/bin/python3 bench/peer/gpt_bigcode_tp.py --tp 2 --layers 24 --embd 256 --heads 8 \\
        --seq 128 --mb 1 --gas 32 --steps 3
Without RANK in the environment it starts --tp ranks of itself (torchrun-style RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each with cores / ranks threads
(intra-op, OpenMP and OpenBLAS), as latchkey's worker does. Every rank-0 step prints one JSON
line: {"step", "loss", "grad_norm", "step_seconds", "cpu_seconds" (this process's user + system
CPU time in the step, every thread), "tokens", "tokens_per_second"}.
"""

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time

from synthetic_data import synthetic_sample  # bench/peer/, the script's own folder

# worker/train/threads.cc's mallopt calls as glibc tunables: M_MMAP_THRESHOLD 32 MiB,
# M_TRIM_THRESHOLD 1 GiB, M_TOP_PAD 16 MiB.
MALLOC_TUNABLES = ("glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824:"
                   "glibc.malloc.top_pad=16777216")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--mb", type=int, default=1)
    p.add_argument("--gas", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data-seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0,
                   help="threads per rank (0: cores / local ranks)")
    p.add_argument("--jsonl", default="", help="rank 0 also appends its step lines here")
    return p.parse_args(argv)


def launch(args):
    """Starts args.tp ranks of this script on this machine and waits for them."""
    with socket.socket() as s:  # a port nothing listens on now; rank 0's store binds it next
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // args.tp)
    procs = []
    for r in range(args.tp):
        env = dict(os.environ)
        env.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
        env.update(RANK=str(r), WORLD_SIZE=str(args.tp), LOCAL_WORLD_SIZE=str(args.tp),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:],
                                      env=env))
    while any(p.poll() is None for p in procs):
        if any(p.returncode not in (None, 0) for p in procs):  # the others would wait for it
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.05)
    return 1 if any(p.wait() != 0 for p in procs) else 0


def run_rank(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // local)
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tp, r = world, rank  # one TP group (DP 1)

    E, H, L, S, V = args.embd, args.heads, args.layers, args.seq, args.vocab
    D, I = E // H, 4 * E
    Hl = H // tp
    assert E % H == 0 and H % tp == 0 and I % tp == 0

    class CopyToTp(torch.autograd.Function):
        """Megatron's f: identity forward, all-reduce of the input gradient backward."""

        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous()
            dist.all_reduce(g)
            return g

    class ReduceFromTp(torch.autograd.Function):
        """Megatron's g: in-place all-reduce of the (fresh) matmul output, identity backward."""

        @staticmethod
        def forward(ctx, x):
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    # The full model from one generator, tensor by tensor in HF parameter order (as latchkey's
    # InitFullWeights), then this rank's shard.
    gen = torch.Generator().manual_seed(args.seed)
    std, proj_std = 0.02, 0.02 / math.sqrt(2.0 * L)

    def normal(shape, s):
        return torch.empty(shape).normal_(0.0, s, generator=gen)

    q_rows = slice(r * Hl * D, (r + 1) * Hl * D)
    cols = slice(r * E // tp, (r + 1) * E // tp)
    inner = slice(r * I // tp, (r + 1) * I // tp)
    P = torch.nn.Parameter
    wte, wpe = P(normal([V, E], std)), P(normal([S, E], std))
    layers = []
    for _ in range(L):
        w = normal([E + 2 * D, E], std)
        c = {
            "ln_1.w": P(torch.ones(E)), "ln_1.b": P(torch.zeros(E)),
            # local rows: this rank's query heads, then the whole K/V head
            "c_attn.w": P(torch.cat([w[q_rows], w[E:]]).contiguous()),
            "c_attn.b": P(torch.zeros(Hl * D + 2 * D)),
            "attn.c_proj.w": P(normal([E, E], proj_std)[:, cols].contiguous()),
            "attn.c_proj.b": P(torch.zeros(E)),
            "ln_2.w": P(torch.ones(E)), "ln_2.b": P(torch.zeros(E)),
            "c_fc.w": P(normal([I, E], std)[inner].contiguous()),
            "c_fc.b": P(torch.zeros(I)[inner].contiguous()),
            "mlp.c_proj.w": P(normal([E, I], proj_std)[:, inner].contiguous()),
            "mlp.c_proj.b": P(torch.zeros(E)),
        }
        layers.append(c)
    ln_f_w, ln_f_b = P(torch.ones(E)), P(torch.zeros(E))

    sharded, replicated = [], [wte, wpe, ln_f_w, ln_f_b]
    for c in layers:
        sharded += [c["attn.c_proj.w"], c["c_fc.w"], c["c_fc.b"], c["mlp.c_proj.w"]]
        replicated += [c["ln_1.w"], c["ln_1.b"], c["attn.c_proj.b"], c["ln_2.w"], c["ln_2.b"],
                       c["mlp.c_proj.b"]]
    params = [wte, wpe] + [p for c in layers for p in c.values()] + [ln_f_w, ln_f_b]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay, foreach=True)

    future = torch.ones(S, S, dtype=torch.bool).triu(1)  # latchkey's cached mask
    pos = torch.arange(S)
    scale = 1.0 / math.sqrt(D)

    def attention(qkv, B):
        q = qkv[..., :Hl * D].view(B, S, Hl, D).transpose(1, 2)  # [B,Hl,S,D]
        k = qkv[..., Hl * D:Hl * D + D].unsqueeze(1)  # [B,1,S,D]: one K/V head for all
        v = qkv[..., Hl * D + D:].unsqueeze(1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        scores.masked_fill_(future, float("-inf"))  # fresh, saved by nothing: in place
        probs = torch.softmax(scores, -1)
        return torch.matmul(probs, v).transpose(1, 2).reshape(B, S, Hl * D)

    def loss_of(ids, labels):
        B = ids.shape[0]
        x = F.embedding(ids, wte) + F.embedding(pos, wpe).unsqueeze(0)
        for c in layers:
            h = CopyToTp.apply(F.layer_norm(x, (E,), c["ln_1.w"], c["ln_1.b"], 1e-5))
            qkv = F.linear(h, c["c_attn.w"], c["c_attn.b"])
            a = ReduceFromTp.apply(F.linear(attention(qkv, B), c["attn.c_proj.w"]))
            x = x + (a + c["attn.c_proj.b"])
            h2 = CopyToTp.apply(F.layer_norm(x, (E,), c["ln_2.w"], c["ln_2.b"], 1e-5))
            f = F.gelu(F.linear(h2, c["c_fc.w"], c["c_fc.b"]), approximate="tanh")
            m = ReduceFromTp.apply(F.linear(f, c["mlp.c_proj.w"]))
            x = x + (m + c["mlp.c_proj.b"])
        x = F.layer_norm(x, (E,), ln_f_w, ln_f_b, 1e-5)
        logits = torch.matmul(x, wte.t())
        return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))

    def batch(m_global):
        rows = [synthetic_sample(args.data_seed, m_global * args.mb + b, S, V)
                for b in range(args.mb)]
        t = torch.tensor(rows, dtype=torch.long)
        return t[:, :S], t[:, 1:]

    kv = slice(Hl * D, Hl * D + 2 * D)
    out = open(args.jsonl, "a") if args.jsonl and rank == 0 else None
    for step in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for m in range(args.gas):
            ids, labels = batch(step * args.gas + m)
            loss = loss_of(ids, labels)
            loss_sum += loss.item()
            (loss / args.gas).backward()
        # The K/V gradient of every layer in one flat buffer, reduced once (coalesced).
        kv_grads = [g for c in layers for g in (c["c_attn.w"].grad[kv], c["c_attn.b"].grad[kv])]
        flat = torch.cat([g.reshape(-1) for g in kv_grads])
        dist.all_reduce(flat)
        at = 0
        for g in kv_grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()
        # Exact global norm: sharded tensors (and this rank's query rows) on every rank,
        # replicated ones (K/V rows included) once, on rank 0. Per-tensor norms of the fp32
        # gradients (views, no copies), their squares summed in float64.
        mine = [p.grad for p in sharded]
        mine += [g for c in layers for g in (c["c_attn.w"].grad[:Hl * D],
                                             c["c_attn.b"].grad[:Hl * D])]
        if r == 0:
            mine += [p.grad for p in replicated] + kv_grads
        total = torch.stack(torch._foreach_norm(mine)).double().square().sum().reshape(1)
        dist.all_reduce(total)
        norm = math.sqrt(float(total))
        coef = args.clip / (norm + 1e-6)
        if args.clip > 0 and coef < 1.0:
            torch._foreach_mul_([p.grad for p in params], coef)
        opt.step()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if rank == 0:
            tokens = args.gas * args.mb * S
            line = json.dumps({"step": step, "loss": loss_sum / args.gas, "grad_norm": norm,
                               "step_seconds": dt, "cpu_seconds": cpu, "tokens": tokens,
                               "tokens_per_second": tokens / dt})
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
    dist.destroy_process_group()
    return 0


def main(argv):
    args = parse_args(argv)
    if "RANK" not in os.environ:
        return launch(args)
    return run_rank(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
