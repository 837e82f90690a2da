"""Helpers the Python benchmarks share (imported from the scripts' own folder)."""

import os
import time


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
