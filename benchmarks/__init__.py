"""Speed and memory measurements (not tests); shared command-line helpers."""

from __future__ import annotations

import argparse
from collections.abc import Iterable


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
