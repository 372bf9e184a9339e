"""A test hook (tests/experiments/test_grid_watch.py), imported at start-up by every Python
process whose PYTHONPATH names this folder: with
``ATTNREPRO_TEST_SLOW_STEPS=<run name>=<seconds>,...``, the process whose command line has
``--run.name=<run name>`` sleeps that many seconds after each optimiser step (torch's global
optimiser step hook), so the cells of one grid move at paces the test chooses: one still
before its first checkpoint while another has one and a third has finished."""

import os
from pathlib import Path

_PACES = os.environ.get("ATTNREPRO_TEST_SLOW_STEPS")

if _PACES:
    _argv = Path("/proc/self/cmdline").read_bytes().decode().split("\0")
    _name = next((a.split("=", 1)[1] for a in _argv if a.startswith("--run.name=")), None)
    _pace = dict(item.split("=") for item in _PACES.split(",")).get(_name)
    if _pace is not None:
        import time

        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(
            lambda optimizer, args, kwargs: time.sleep(float(_pace)))
