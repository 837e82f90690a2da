"""Shared by the deploy tests: find kubectl, render an overlay, pick objects out of it."""
import os
import shutil
import subprocess
import sys

import yaml

SKIP = 77  # ctest SKIP_RETURN_CODE


def skip(reason):
    """Skips the test (exit 77), except in CI (CI=true), where a missing tool or venv fails it."""
    if os.environ.get("CI") == "true":
        print(f"FAIL: {reason} (CI=true: the deploy tests' tools are required)")
        sys.exit(1)
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


def kubectl():
    path = shutil.which("kubectl")
    if path is None:
        skip("kubectl is not installed (it renders the kustomize overlays offline; "
             "kubectl >= 1.27 with kustomize v5, not Debian's kubernetes-client 1.20)")
    return path


def render(overlay):
    """The objects `kubectl kustomize OVERLAY` renders; raises on a render error."""
    out = subprocess.run([kubectl(), "kustomize", overlay], check=True, capture_output=True,
                         text=True, timeout=120)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(objects, kind, name):
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(f"{kind}/{name} is not among the rendered objects")
