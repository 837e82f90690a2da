"""Helpers the Python benchmarks share (imported from the scripts' own folder)."""

import os
import socket
import time

# The job bench/coordinator_overhead.py and bench/trace_overhead.py run: a small MQA model (4
# layers, n_embd 128) on 2 ranks with TP 2, GAS 4, synthetic data, coalesced K/V.
TP2_SPEC = {
    "model": {"model_type": "gpt_bigcode", "n_layer": 4, "n_embd": 128, "n_head": 8,
              "vocab_size": 256, "n_positions": 128, "multi_query": True},
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
    "tensor_parallel": {"autotp_size": 2},
    "latchkey": {"seq_len": 128, "steps": 30, "seed": 1, "world_size": 2,
                 "kv_reduce": "coalesced", "data": {"synthetic": {"seed": 1}}},
}


def free_port():
    """A TCP port nothing listens on now (the kernel's pick; the ranks bind it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_appended_lines(path, seen):
    """The whole lines appended to `path` past byte `seen`.

    Returns (time.monotonic() when they were read, their bytes, the new `seen`); no bytes while
    the file is missing or has not grown. A line still being written (no newline yet) waits for
    the next call.
    """
    try:
        size = os.path.getsize(path)
    except OSError:
        return None, b"", seen
    if size <= seen:
        return None, b"", seen
    now = time.monotonic()
    with open(path, "rb") as f:
        f.seek(seen)
        chunk = f.read(size - seen)
    complete = chunk[:chunk.rfind(b"\n") + 1]  # only whole lines count
    return now, complete, seen + len(complete)
