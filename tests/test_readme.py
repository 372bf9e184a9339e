"""The README stays true: its mechanism table is the registry's, every script and grid its
feature table names exists, and its two set-up commands are Makefile targets."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from attention.registry import context_table

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_mechanism_table_is_the_registrys():
    assert context_table() in README


def test_feature_table_names_existing_scripts_and_grids():
    named = re.findall(r"`(\w+)\.py (\w+)`", README)
    assert len(named) >= 8
    for script, grid in named:
        experiment = importlib.import_module(f"experiments.{script}").EXPERIMENT
        assert grid in experiment.grids, (script, grid)


def test_quickstart_commands_are_make_targets():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in README
        assert re.search(rf"^{target}:", makefile, re.M)
    assert "PLACEHOLDER" not in README and "DEMO_SCALE" not in README and "RESULTS\n" not in README
