"""Speed and memory measurements (not tests); shared command-line helpers."""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterable, Sequence


def choose(parser: argparse.ArgumentParser, flag: str, value: str, choices: Iterable[str],
           baseline: str) -> list[str]:
    """The comma-separated names of ``value``, which must include ``baseline`` (the ratios
    are against it) and name only ``choices``; else the parser's one-line error."""
    choices = list(choices)
    names = [n.strip() for n in value.split(",")]
    if any(n not in choices for n in names) or baseline not in names:
        parser.error(f"{flag} must include {baseline!r} (the baseline) and only {choices}; "
                     f"got {names}")
    return names


def paired_ratio(base: Sequence[float], times: Sequence[float], resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """sum(times) / sum(base) and its 95% interval from ``resamples`` bootstrap resamples of
    the pairs (base[i], times[i]), measured side by side (the same round or batch): a slow
    phase of the machine moves both members of a pair, so the interval holds the ratio's
    noise, not the machine's."""
    import torch

    if len(base) != len(times) or not base:
        raise ValueError(f"paired_ratio: {len(base)} baseline and {len(times)} times; "
                         "expected the same number, at least one")
    b = torch.tensor(list(base), dtype=torch.float64)
    t = torch.tensor(list(times), dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(b), (resamples, len(b)), generator=gen)
    ratios = t[picks].sum(1) / b[picks].sum(1)
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64))
    return float(t.sum() / b.sum()), float(low), float(high)


def take_turns(names: Iterable, items: Iterable, step: Callable[..., float],
               seed: int = 0) -> dict:
    """For each of ``items`` (a round, a batch), every name's ``step(name, item)`` once, in a
    new random order each time, so that a slow phase of the machine falls on all of them:
    the seconds each step returned, per name, in the order of ``items`` (pairs for
    :func:`paired_ratio`)."""
    names, order = list(names), random.Random(seed)
    times: dict = {name: [] for name in names}
    for item in items:
        turn = list(names)
        order.shuffle(turn)
        for name in turn:
            times[name].append(step(name, item))
    return times


def peak_alloc_mb(fn: Callable[[], None]) -> float | None:
    """Peak of the bytes held by torch tensors during the call beyond those held before it
    (MiB), from the profiler's memory timeline (what ``max_memory_allocated`` would say on a
    GPU); None where the profiler gives no timeline."""
    import json
    import tempfile
    from pathlib import Path

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timeline.json"
        try:
            with torch.profiler.profile(profile_memory=True, record_shapes=True,
                                        with_stack=True) as prof:
                fn()
            prof.export_memory_timeline(str(path), device="cpu")
            _, sizes = json.loads(path.read_text())
        except (RuntimeError, ValueError, OSError):
            return None
    totals = [sum(s) for s in sizes]
    return (max(totals) - totals[0]) / 2**20 if totals else None


def provenance(module: str, argv: list[str]) -> dict:
    """Where and how a measurement was made, for the rows a benchmark writes: the command
    (``python -m <module> <argv>``), the machine (CPU model, cores, torch and its CPU
    capability), the CPU's features that decide what bfloat16 costs (AVX-512 BF16, AMX),
    torch's threads, the load average, the date and the commit (``with uncommitted changes``
    when the code differs from it; results files a rerun writes do not count)."""
    import datetime
    import os
    import shlex
    import subprocess
    from pathlib import Path

    import torch

    from benchmarks.attention import machine
    from lit_models.base import cpu_host

    root = Path(__file__).resolve().parents[1]

    def git(*command: str) -> str:
        done = subprocess.run(["git", *command], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short=7", "HEAD") or "not recorded"
    # the code's changes, not the results files a rerun writes (the SST file, written
    # first, made the IMDb row of the same command say "uncommitted")
    if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"):
        commit += " with uncommitted changes"
    info = machine()
    return {"command": shlex.join(["python", "-m", module, *argv]),
            "machine": f"{info['cpu']} ({info['cores']} cores), torch {info['torch']} with "
                       f"{torch.backends.cpu.get_cpu_capability()} kernels",
            # the instruction sets that decide what bfloat16 costs (AMX tiles, AVX-512 BF16)
            "cpu_features": {key.removeprefix("machine/cpu_has_"): value
                             for key, value in cpu_host().items() if "_has_" in key},
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit}
