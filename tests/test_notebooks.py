"""Every notebook in notebooks/ runs top to bottom (short settings: the notebook reads them
from the environment).  Outputs are not compared: a notebook is a visual study."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NEEDS = {"coda_fig2.ipynb": "snli/snli_1.0_dev.first1288.jsonl"}  # shared data they read
SHORT = {"CODA_FIG2_STEPS": "20", "ATTNREPRO_THREADS": "1"}

pytestmark = pytest.mark.slow


def test_every_notebook_is_listed():
    assert NOTEBOOKS and {p.name for p in NOTEBOOKS} == set(NEEDS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, shared, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    shared(NEEDS[path.name])
    for key, value in SHORT.items():
        monkeypatch.setenv(key, value)  # the kernel inherits the environment
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
