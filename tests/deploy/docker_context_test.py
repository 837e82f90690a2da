#!/usr/bin/env python3
"""The images' build context holds what the build reads: every top-level folder or file of the
repository that the top-level CMakeLists.txt names (outside comments) is copied into the build
stage of docker/Dockerfile and docker/cuda.Dockerfile and let through
docker/Dockerfile.dockerignore. A folder added to the build (an include(), an add_subdirectory())
but not to the images fails here instead of in a 20-minute image build.

Usage: docker_context_test.py REPO_ROOT"""
import os
import re
import subprocess
import sys


def top_level_entries(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                         check=True).stdout.split()
    return sorted({p.split("/", 1)[0] for p in out})


def needed(root, entries):
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        text = "\n".join(line.split("#", 1)[0] for line in f)
    want = {"CMakeLists.txt"}
    for e in entries:
        if e != "CMakeLists.txt" and re.search(r"(?<![\w./-])" + re.escape(e) + r"(?![\w-])", text):
            want.add(e)
    return want


def build_stage_copies(path):
    """The sources of COPY lines before the first `FROM ... AS runtime`-like second stage."""
    copies = set()
    froms = 0
    with open(path) as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            if words[0] == "FROM":
                froms += 1
                if froms > 1:
                    break
            if words[0] == "COPY" and not any(w.startswith("--from") for w in words):
                args = [w for w in words[1:] if not w.startswith("--")]
                for src in args[:-1]:
                    copies.add(src.rstrip("/").split("/", 1)[0])
    return copies


def allowed_by_ignore(path):
    allowed = set()
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("!"):
                allowed.add(line[1:].split("/", 1)[0])
    return allowed


def main(argv):
    root = argv[1]
    want = needed(root, top_level_entries(root))
    failures = []
    for name in ("Dockerfile", "cuda.Dockerfile"):
        have = build_stage_copies(os.path.join(root, "docker", name))
        missing = sorted(want - have)
        if missing:
            failures.append(f"docker/{name}: the build stage copies no {', '.join(missing)}")
    allowed = allowed_by_ignore(os.path.join(root, "docker", "Dockerfile.dockerignore"))
    missing = sorted(want - allowed)
    if missing:
        failures.append(f"docker/Dockerfile.dockerignore lets no {', '.join(missing)} through")
    print(f"the build reads {', '.join(sorted(want))}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
