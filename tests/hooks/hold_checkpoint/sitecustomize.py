"""A test hook (tests/end_to_end/test_kill_resume.py), imported at start-up by every Python process
whose PYTHONPATH names this folder: with ``ATTNREPRO_TEST_HOLD_CHECKPOINT=<marker file>``,
the first checkpoint this process writes (a file in a ``checkpoints`` folder, through
``fileio.write_atomic``) is left half-written in its temporary file, the marker is written
with that file's path, and the process waits there to be killed: a process killed in the
middle of a checkpoint's write, at a moment the test chooses instead of one it must catch.
Once the marker exists the hook does nothing (the restarts after the kill write normally)."""

import os
import time
from pathlib import Path

_MARKER = os.environ.get("ATTNREPRO_TEST_HOLD_CHECKPOINT")

if _MARKER:
    import fileio

    _write_atomic = fileio.write_atomic

    def _held(path, content, *args, **kwargs):
        marker = Path(_MARKER)
        if Path(path).parent.name != "checkpoints" or not callable(content) or marker.exists():
            return _write_atomic(path, content, *args, **kwargs)

        def half_then_wait(tmp):
            content(tmp)
            size = os.path.getsize(tmp)
            with open(tmp, "r+b") as f:
                f.truncate(size // 2)
            marker.write_text(str(tmp))
            while True:  # killed here
                time.sleep(1)

        return _write_atomic(path, half_then_wait, *args, **kwargs)

    fileio.write_atomic = _held
