"""Runs a Python test inside the pinned venv of the tool it tests against (scripts/*-venv.sh make
them; scripts/test.sh runs those first). Imported by the tests from this folder."""
import os
import sys


def run_in_venv(venv, what, make_command, missing_skips=True):
    """Re-executes this script with `venv`'s python unless it already runs there.

    A missing venv skips the test (exit 77, ctest's SKIP_RETURN_CODE) naming `make_command`,
    the command that makes it; it fails instead under CI=true, or when `missing_skips` is False.
    `what` names the venv in the message ("the trace test venv").
    """
    venv = os.path.abspath(venv)
    if os.path.abspath(sys.prefix) == venv:
        return
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        why = (f"{what} {venv} is missing; create it with `{make_command} {venv}` "
               f"(scripts/test.sh does this)")
        if not missing_skips:
            sys.exit("FAIL: " + why)
        if os.environ.get("CI") == "true":
            sys.exit("FAIL: " + why + "; CI=true requires it")
        print("SKIP: " + why)
        sys.exit(77)
    os.execv(python, [python] + sys.argv)
