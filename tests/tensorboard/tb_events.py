#!/usr/bin/env python3
"""What the real TensorBoard (the venv of scripts/tensorboard-venv.sh) reads from a folder of
event files, and the rank-0 JSONL it must agree with. Imported by tensorboard_test.py; run as a
script (`python tb_events.py DIR`) it prints {tag: [[step, value], ...]} as TensorBoard's
EventAccumulator loads DIR, for tests whose own interpreter has no tensorboard (tests/data/).
"""
import json
import struct
import sys

# The scalars rank 0 writes, named as the JSONL fields (docs/observability.md "TensorBoard").
TAGS = ("loss", "eval_loss", "lr", "grad_norm", "tokens_per_second", "step_seconds",
        "kv_allreduce_calls", "collective_share", "checkpoint_seconds", "peak_memory_bytes")


def accumulate(folder):
    """{tag: [(step, value), ...]} as TensorBoard's EventAccumulator reads `folder` (every
    scalar kept: size guidance 0), with the orphaned-data purge TensorBoard applies."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(folder, size_guidance={ea.SCALARS: 0}, purge_orphaned_data=True)
    acc.Reload()
    return {t: [(s.step, s.value) for s in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def events(path):
    """The Event protos of one file, through TensorBoard's own loader (it stops at a truncated
    or corrupt record)."""
    from tensorboard.backend.event_processing import event_file_loader

    return list(event_file_loader.EventFileLoader(path).Load())


def whole_records(data):
    """The byte offsets where each whole TFRecord of `data` ends, read from the framing
    (u64 length, u32 masked CRC, payload, u32 masked CRC) independently of TensorBoard."""
    ends, at = [], 0
    while at + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        end = at + 12 + n + 4
        if end > len(data):
            break
        ends.append(end)
        at = end
    return ends


def jsonl_by_step(path):
    """{step: record} of a JSONL, the last record of each step winning (a resumed attempt
    repeats the steps after its checkpoint)."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out[r["step"]] = r
    return out


def expected_scalars(by_step):
    """{tag: [(step, value), ...]} that the JSONL's records say TensorBoard must show."""
    out = {}
    for step in sorted(by_step):
        for tag in TAGS:
            if tag in by_step[step]:
                out.setdefault(tag, []).append((step, by_step[step][tag]))
    return out


def main():
    json.dump({t: v for t, v in accumulate(sys.argv[1]).items()}, sys.stdout)


if __name__ == "__main__":
    main()
