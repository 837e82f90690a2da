"""Shared by the deploy tests: find kubectl, render an overlay, pick objects out of it."""
import shutil
import subprocess
import sys

import yaml

SKIP = 77  # ctest SKIP_RETURN_CODE


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


def kubectl():
    path = shutil.which("kubectl")
    if path is None:
        skip("kubectl is not installed (it renders the kustomize overlays offline)")
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
