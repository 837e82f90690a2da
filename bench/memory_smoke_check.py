#!/usr/bin/env python3
"""Runs bench_memory on a small model and checks its two tables, not only its exit code.

Recompute table: one row per (recompute mode, sequence parallelism) pair; each mode's measured
activation bytes relative to mode none without SP within 0.05 of the formula's ratio (the
measured/formula column itself is below 1 at this size: the formula counts a few buffers the
small model shares); full < selective < none in measured bytes, SP on below SP off.
ZeRO table: stage 2's gradient-related peak below stage 1's.

Usage: memory_smoke_check.py BENCH_MEMORY [ARGS...]
"""
import subprocess
import sys


def tables(text):
    """The markdown tables of `text`: a list of lists of row dicts keyed by header."""
    out, header, rows = [], None, []
    for line in text.splitlines():
        if not line.startswith("|"):
            if header:
                out.append(rows)
            header, rows = None, []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif set("".join(cells)) <= set("-: "):
            continue
        else:
            rows.append(dict(zip(header, cells)))
    if header:
        out.append(rows)
    return out


def first_number(cell):
    return float(cell.split()[0])


def main():
    run = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=110)
    print(run.stdout)
    if run.returncode != 0:
        sys.exit(f"bench_memory exited {run.returncode}: {run.stderr}")
    found = tables(run.stdout)
    if len(found) != 2:
        sys.exit(f"expected 2 tables, found {len(found)}")
    recompute, zero = found
    failures = []
    pairs = {(r["recompute"], r["SP"]) for r in recompute}
    want_pairs = {(m, sp) for m in ("none", "selective", "full") for sp in ("off", "on")}
    if pairs != want_pairs:
        failures.append(f"recompute rows {sorted(pairs)}, want {sorted(want_pairs)}")
    measured = {}
    for r in recompute:
        key = (r["recompute"], r["SP"])
        # The header repeats "formula": zip kept the last one, the ratio column's.
        got, want = first_number(r["vs none no-SP measured"]), first_number(r["formula"])
        measured[key] = first_number(r["act MiB/layer measured"])
        if abs(got - want) > 0.05:
            failures.append(f"{key}: measured ratio {got} vs formula {want}")
    if pairs == want_pairs:
        for sp in ("off", "on"):
            if not measured[("full", sp)] <= measured[("selective", sp)] <= measured[("none", sp)]:
                failures.append(f"SP {sp}: activation bytes not full <= selective <= none")
        for m in ("none", "selective", "full"):
            if measured[(m, "on")] > measured[(m, "off")]:
                failures.append(f"{m}: SP on holds more than SP off")
    stages = {r["ZeRO stage"]: r for r in zero}
    if set(stages) != {"1", "2"}:
        failures.append(f"ZeRO rows {sorted(stages)}, want 1 and 2")
    elif not (first_number(stages["2"]["gradient-related peak MiB"]) <
              first_number(stages["1"]["gradient-related peak MiB"])):
        failures.append("ZeRO 2's gradient-related peak is not below ZeRO 1's")
    if failures:
        sys.exit("bench_memory tables:\n  " + "\n  ".join(failures))
    print("bench_memory tables: every check holds")


if __name__ == "__main__":
    main()
