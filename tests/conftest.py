"""Shared fixtures: the real published data at ../shared/data (skipped with a reason when
absent) and float64 defaults for formula tests."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from datamodules.common import shared_data_dir

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


def shared_path(relative: str) -> Path:
    """A file or folder of ../shared/data, or skip the test saying what is missing."""
    path = shared_data_dir() / relative
    if not path.exists():
        pytest.skip(f"real data not available: {path} "
                    "(tests read ../shared/data beside the project)")
    return path


@pytest.fixture
def shared():
    return shared_path
