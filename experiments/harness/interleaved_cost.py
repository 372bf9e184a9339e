"""A grid's training cost measured with its models taking turns in one process (the grid's
``cost_file``: the JSONL ``python -m benchmarks.model_cost --out`` writes, one row per cell),
read for ``report`` and ``report --plot`` (:func:`read_cost_file`).

Why not the runs' own logs: runs of one grid train hours apart, two at a time beside other
jobs, and the load of the machine sets their steps/s (one CoDA seed of the same cost grid ran
at 7.55 steps/s against 10.27 and 10.55, results/dwin_classification_cost.md).  In the
benchmark every model trains on the same batches, one step of each in turn in a new random
order, so a slow phase falls on all of them and their ratio keeps what is the mechanism's.

A row (keys the benchmark writes): ``cell``, ``baseline`` (the cell of the ratios),
``parameters``, ``steps_per_s``, ``ratio_vs_softmax`` with its 95% interval
``ratio_low``/``ratio_high`` (steps/s over the baseline's, paired bootstrap), ``step_tensor_mb``
(the peak of tensor memory in one training step, beyond what was held before it), and the
``setting`` it was measured in (command, config, dataset, machine, threads, date, commit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from experiments.harness.grid_model import PROJECT_ROOT, Grid

#: the keys every row of a cost file has
KEYS = ("cell", "baseline", "parameters", "steps_per_s", "ratio_vs_softmax", "ratio_low",
        "ratio_high", "step_tensor_mb", "setting")


@dataclass(frozen=True)
class CellCost:
    """One cell's row of a cost file."""

    cell: str
    baseline: str
    parameters: int
    steps_per_s: float
    ratio: float  # steps/s over the baseline's
    low: float
    high: float
    step_tensor_mb: float | None
    setting: dict

    @property
    def time_ratio(self) -> tuple[float, float, float]:
        """The step-time ratio to the baseline (1 / ``ratio``) and its 95% interval."""
        return 1 / self.ratio, 1 / self.high, 1 / self.low


def read_cost_file(grid: Grid) -> dict[str, CellCost] | None:
    """cell -> its measured cost, from the grid's ``cost_file``; None when the file does not
    exist (not measured yet).  A malformed file, or one naming a cell the grid does not
    have, ends the command with one line naming the file and the line."""
    path = PROJECT_ROOT / grid.cost_file
    if not path.exists():
        return None
    names = {c.name for c in grid.cells}
    out = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{grid.cost_file} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{where}: not JSON ({err.msg})") from None
        missing = [k for k in KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            raise SystemExit(f"{where}: no {', '.join(missing)} (written by python -m "
                             "benchmarks.model_cost --out?)")
        if row["cell"] not in names or row["baseline"] not in names:
            raise SystemExit(f"{where}: cell {row['cell']!r} (baseline {row['baseline']!r}) "
                             f"is not a cell of grid {grid.name}; measure the grid's cells "
                             "again")
        out[row["cell"]] = CellCost(row["cell"], row["baseline"], row["parameters"],
                                    row["steps_per_s"], row["ratio_vs_softmax"],
                                    row["ratio_low"], row["ratio_high"],
                                    row["step_tensor_mb"], row["setting"])
    return out

