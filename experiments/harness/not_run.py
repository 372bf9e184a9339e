"""Why a claim of the claims board was not run here: none of its data is here (the data
registry's files under the data root, datamodules/registry.py), else the grid has not been
run at the paper config (the command that runs the claim's cells, what docs/cost.md says
that costs on this machine, and which files are missing when the data is here in part).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from experiments.harness.grid_model import PROJECT_ROOT, Cell, Experiment, Grid
from experiments.harness.markdown import table_row
from experiments.harness.scale import PAPER, data_class_name, merged_settings

COST_DOC = PROJECT_ROOT / "docs" / "cost.md"
#: the table of docs/cost.md that gives each grid's cost at the paper's scale
COST_SECTION = "## What each grid costs at paper scale"


@cache
def cost_estimates(path: Path = COST_DOC) -> dict[tuple[str, str], str]:
    """(experiment, grid) -> what docs/cost.md's table says a run at the paper config costs
    on this machine (a run's budget and its last column), for every grid its first column
    names: ```coda_nli table3` / `table8``` names coda_nli's table3 and table8."""
    text = path.read_text().split(COST_SECTION, 1)[-1].split("\n## ", 1)[0]
    out = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = table_row(line)
        names = re.findall(r"`([^`]+)`", cells[0])
        experiment, first = names[0].split()[:2]
        for grid in [first, *(n.split()[-1] for n in names[1:])]:
            out[(experiment, grid)] = f"{cells[2]} per run; measured here: {cells[-1]}"
    return out


def data_state(experiment: Experiment, cell: Cell, root: Path | None = None
               ) -> tuple[str, str] | None:
    """Whether the registry's files of the data a cell reads (at the paper config) are under
    the data root: ("complete" | "in part" | "missing", what to say), None when the registry
    lists no dataset for its DataModule.  A DataModule listed by several entries (the SST
    trees and GLUE's SST-2) is judged by its class's own entry, else the entry whose folder
    its data settings name, else the most complete."""
    from datamodules.fetch import data_root
    from datamodules.registry import DATASETS

    root = data_root() if root is None else root
    name = data_class_name(experiment, PAPER, cell)
    entries = [e for e in DATASETS.values() if name in e.datamodules]
    if not entries:
        return None
    data = str(merged_settings(experiment, PAPER, cell).get("data"))

    own = [e for e in entries if e.folder in data] or entries
    missing_of = {e.key: [p for p in e.needed if not (root / e.folder / p).exists()]
                  for e in own}
    entry = min(own, key=lambda e: len(missing_of[e.key]) / max(1, len(e.needed)))
    needed, missing = entry.needed, missing_of[entry.key]
    where = (f"{entry.title}: {len(missing)} of its {len(needed)} files are not under the "
             f"data root (the first: {entry.folder}/{missing[0] if missing else ''}; python -m "
             f"datamodules.fetch --status {entry.key})")
    if not missing:
        return "complete", f"{entry.title} is here"
    return ("missing" if len(missing) == len(needed) else "in part"), where


def why_not_run(names: list[tuple[Experiment, Grid, str, str]], checked: bool) -> str:
    """Why a claim (the grids that name it, ``(experiment, grid, baseline, proposal)``, the
    first its home) has no measurement: none of its data is here (which), else the command
    that runs it at the paper config and its cost (and which files are missing when the
    data is here in part); ``checked``: a smoke run of it exists."""
    experiment, grid, baseline, proposal = names[0]
    smoke = "only a smoke check ran (it runs, no measurement); " if checked else ""
    states = [s for s in (data_state(experiment, grid.cell(c)) for c in (baseline, proposal))
              if s is not None]
    missing = next((what for state, what in states if state == "missing"), None)
    if missing:
        return f"{smoke}the data is not here: {missing}"
    part = next((what for state, what in states if state == "in part"), None)
    cost = next((cost_estimates()[(e.name, g.name)] for e, g, _, _ in names
                 if (e.name, g.name) in cost_estimates()), None)
    return (smoke + (f"the data is here in part ({part}); " if part else "")
            + f"not run yet: `python experiments/{experiment.name}.py grid {grid.name} "
              f"--config {PAPER} --cells {baseline} {proposal}`"
            + (f"; at the paper config (docs/cost.md): {cost}" if cost else ""))
