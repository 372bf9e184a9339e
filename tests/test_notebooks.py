"""Every notebook in notebooks/ runs top to bottom at a short setting (each reads its steps
from the environment) and writes only under the runs folder it is given ($ATTNREPRO_RUNS),
never into the repository.  Outputs are not compared, a notebook is a visual study, except
CoDA Figure 2's summary: results/coda_fig2_summary.csv (``python -m experiments.figures
coda_fig2 --out results``) holds the rows at initialisation and after 20 steps of the run
it reports, and the notebook's own 20-step run must give them again, so that a change of the
code that would change the committed figure fails here."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from experiments import figures

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SNLI = ("snli/snli_1.0_dev.first1288.jsonl",)
# per notebook: the shared data it reads, and the study folder and files it writes
NEEDS = {
    "coda_fig2.ipynb": (SNLI, "coda_fig2", figures.FIG2_FILES),
    "window_masks.ipynb": (("sst_ptb/train.txt", "sst_ptb/dev.txt"), "window_masks",
                           ("window_MW.png", "window_AW.png", "window_weights.png",
                            "window_statistics.json")),
    "decomposable_attention_maps.ipynb": (
        SNLI, "decomposable_attention_maps",
        ("decomp_vanilla_pair0.png", "decomp_intra_pair2.png", "routing.png",
         "decomp_summary.json")),
    "density_matrix.ipynb": (
        ("iwslt15_en_vi/train.first1000.en", "iwslt15_en_vi/tst2012.vi",
         "iwslt15_en_vi/vocab.vi"), "density_matrix",
        ("psi_MQT.png", "psi_AQT.png", "diagonal_AQT.png", "density_statistics.json")),
}
SHORT = {"CODA_FIG2_STEPS": str(figures.FIG2_CHECK), "WINDOW_MASKS_STEPS": "30",
         "DECOMP_MAPS_STEPS": "20", "DENSITY_MATRIX_STEPS": "15", "ATTNREPRO_THREADS": "1"}
COMMITTED_FIG2 = ROOT / "results" / figures.FIG2_FILES[0]


def test_every_notebook_is_listed_and_committed_without_outputs():
    assert NOTEBOOKS and {p.name for p in NOTEBOOKS} == set(NEEDS)
    for path in NOTEBOOKS:
        cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in cells), path.name


def test_committed_figure_2_summary_has_every_setting_at_every_recorded_step():
    table = figures.read_fig2_summary(COMMITTED_FIG2)
    assert set(table) == {(setting, step) for setting in figures.FIG2_SETTINGS
                          for step in (0, figures.FIG2_CHECK, figures.FIG2_STEPS)}
    assert (ROOT / "results" / figures.FIG2_FILES[1]).stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, shared, monkeypatch, tmp_path):
    from nbclient import NotebookClient

    data, study, files = NEEDS[path.name]
    for needed in data:
        shared(needed)
    for key, value in {**SHORT, "ATTNREPRO_RUNS": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)  # the kernel inherits the environment
    tracked = {p: p.read_bytes() for p in (ROOT / "results").glob("coda_fig2*")}
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the notebook shows no figure"
    out = tmp_path / "figures" / study
    assert all((out / name).stat().st_size > 0 for name in files)
    assert {p: p.read_bytes() for p in tracked} == tracked  # the committed files untouched
    if path.name == "coda_fig2.ipynb":
        ours = figures.read_fig2_summary(out / figures.FIG2_FILES[0])
        committed = figures.read_fig2_summary(COMMITTED_FIG2)
        short = [key for key in committed if key[1] <= figures.FIG2_CHECK]
        assert set(ours) == set(short)
        for key in short:
            assert ours[key] == pytest.approx(committed[key], abs=2e-3), key
