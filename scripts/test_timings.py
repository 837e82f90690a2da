#!/usr/bin/env python3
"""Rewrites the measured-cost table of docs/testing.md from a build's ctest records.

ctest keeps each test's last measured seconds in BUILD/Testing/Temporary/CTestCostData.txt
(`NAME RUNS SECONDS` lines, then `---` and the failed tests); the tier of each test comes from
`ctest --show-only=json-v1`. The table between the markers in docs/testing.md is replaced: the
20 slowest tests, and the seconds per tier. Run it after a full `scripts/test.sh`:

    python3 scripts/test_timings.py build
"""
import json
import pathlib
import subprocess
import sys

TIERS = ["unit", "process", "e2e", "tool", "soak"]
BEGIN = "<!-- test-timings: begin (scripts/test_timings.py writes this table) -->"
END = "<!-- test-timings: end -->"


def costs(build):
    path = build / "Testing" / "Temporary" / "CTestCostData.txt"
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() == "---":
            break
        parts = line.rsplit(" ", 2)
        if len(parts) == 3:
            out[parts[0]] = float(parts[2])
    return out


def tiers(build):
    shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                           capture_output=True, text=True).stdout
    out = {}
    for test in json.loads(shown)["tests"]:
        labels = []
        for prop in test.get("properties", []):
            if prop["name"] == "LABELS":
                labels = prop["value"]
        out[test["name"]] = next((t for t in TIERS if t in labels), "none")
    return out


def table(build):
    cost = costs(build)
    tier = tiers(build)
    measured = {name: sec for name, sec in cost.items() if name in tier}
    lines = [BEGIN, "",
             f"Measured: {len(measured)} of {len(tier)} tests, "
             f"{sum(measured.values()) / 60:.1f} minutes of test time in all (`ctest -j2` "
             "overlaps two).", "",
             "| tier | tests | measured | seconds |", "|---|---|---|---|"]
    for t in TIERS:
        names = [n for n in tier if tier[n] == t]
        secs = sum(measured.get(n, 0.0) for n in names)
        done = sum(1 for n in names if n in measured)
        lines.append(f"| {t} | {len(names)} | {done} | {secs:.0f} |")
    lines += ["", "The 20 slowest:", "", "| seconds | tier | test |", "|---|---|---|"]
    for name, sec in sorted(measured.items(), key=lambda kv: -kv[1])[:20]:
        lines.append(f"| {sec:.1f} | {tier[name]} | `{name}` |")
    lines += ["", END]
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_timings.py BUILD_DIR")
    build = pathlib.Path(sys.argv[1]).resolve()
    doc = pathlib.Path(__file__).resolve().parent.parent / "docs" / "testing.md"
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{doc}: the markers of the timing table are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(head + table(build) + tail)
    print(f"wrote the timing table of {doc}")


if __name__ == "__main__":
    main()
