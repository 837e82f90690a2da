#!/usr/bin/env python3
"""The images' build context holds what the build reads: every top-level folder or file of the
repository that the top-level CMakeLists.txt names (outside comments) is copied into the build
stage of docker/Dockerfile and docker/cuda.Dockerfile and let through
docker/Dockerfile.dockerignore; every path either Dockerfile copies from the context (the
sources, docker/*.sh, docker/cuda-requirements.txt) exists in the repository and is let through
the dockerignore (its rules applied in order, the last match winning, as Docker and podman do).
A folder added to the build (an include(), an add_subdirectory()) but not to the images fails
here instead of in a 20-minute image build. And the image the gpu overlay of deploy/k8s names
(for the `latchkey` image every container of the base uses) is the one
`scripts/image.sh --cuda` tags.

Usage: docker_context_test.py REPO_ROOT"""
import fnmatch
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


def context_copies(path):
    """Every source path of the COPY lines (all stages) that reads the build context."""
    copies = []
    with open(path) as f:
        for line in f:
            words = line.split()
            if words and words[0] == "COPY" and not any(w.startswith("--from") for w in words):
                copies += [w.rstrip("/") for w in words[1:] if not w.startswith("--")][:-1]
    return copies


def ignore_rules(path):
    rules = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def pattern_matches(pattern, path):
    """Docker's dockerignore match: `**` any number of folders, `*` within one; a folder that
    matches takes everything under it."""
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            regex += ".*"
            i += 2
        else:
            regex += fnmatch.translate(pattern[i]).replace(r"(?s:", "(?:")[:-2].replace(
                ".*", "[^/]*")
            i += 1
    return re.fullmatch(f"(?:{regex})(?:/.*)?", path) is not None


def let_through(rules, path):
    """Whether the dockerignore sends `path` (a file, or a folder with all its files)."""
    sent = True
    for negated, pattern in rules:
        if pattern_matches(pattern, path):
            sent = negated
    return sent


def overlay_image(root, overlay):
    """newName:newTag of the `latchkey` image in deploy/k8s/overlays/OVERLAY/kustomization.yaml."""
    with open(os.path.join(root, "deploy", "k8s", "overlays", overlay, "kustomization.yaml")) as f:
        text = f.read()
    m = re.search(r"^\s*-\s*name:\s*latchkey\s*\n\s*newName:\s*(\S+)\s*\n\s*newTag:\s*(\S+)",
                  text, re.M)
    return f"{m.group(1)}:{m.group(2)}" if m else None


def base_images(root):
    """The images the containers of deploy/k8s/base use."""
    images = set()
    base = os.path.join(root, "deploy", "k8s", "base")
    for name in sorted(os.listdir(base)):
        if name.endswith(".yaml") and name != "kustomization.yaml":
            with open(os.path.join(base, name)) as f:
                images |= set(re.findall(r"^\s*image:\s*(\S+)", f.read(), re.M))
    return images


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
    rules = ignore_rules(os.path.join(root, "docker", "Dockerfile.dockerignore"))
    tracked = set(subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                                 check=True).stdout.split())
    for name in ("Dockerfile", "cuda.Dockerfile"):
        for src in context_copies(os.path.join(root, "docker", name)):
            if src.startswith("docker/.prebuilt"):
                continue  # written by scripts/image.sh --fast, not tracked
            files = [t for t in tracked if t == src or t.startswith(src + "/")]
            held = [f for f in files if not let_through(rules, f)]
            if not files:
                failures.append(f"docker/{name} copies {src}, which the repository has not")
            elif held:
                failures.append(f"docker/{name} copies {src}, whose {held[0]} (and {len(held) - 1} "
                                "more) the dockerignore holds back")
    # The dockerignore's own match: it holds back what the images never read.
    for held in ("docs/deploy.md", "scripts/image.sh", "deploy/k8s/base/coordinator.yaml"):
        if let_through(rules, held):
            failures.append(f"docker/Dockerfile.dockerignore sends {held} (the match is wrong)")
    # The gpu overlay names the image scripts/image.sh --cuda builds.
    if base_images(root) != {"latchkey"}:
        failures.append(f"deploy/k8s/base's containers use {sorted(base_images(root))}, "
                        "not just the image `latchkey` the overlays set")
    for overlay, flags in (("gpu", ["--cuda"]),):
        tag = subprocess.run(["bash", os.path.join(root, "scripts", "image.sh"), *flags,
                              "--print-tag"], capture_output=True, text=True, check=True
                             ).stdout.strip()
        named = overlay_image(root, overlay)
        print(f"overlay {overlay}: {named}; scripts/image.sh {' '.join(flags + ['--print-tag'])}: "
              f"{tag}")
        if named != tag:
            failures.append(f"deploy/k8s/overlays/{overlay} names the image {named}, "
                            f"scripts/image.sh {' '.join(flags)} tags {tag}")
    print(f"the build reads {', '.join(sorted(want))}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
