"""The scale of a grid's runs at a config, read from the config files the cells merge: a
smoke config, or data that is synthetic or a sample (both: a check that the grid runs, not a
measurement), the training budget against the paper config's (``configs/<experiment>/
paper.yaml`` and its dataset configs: the paper's settings) and the model and batch settings
that differ from the paper config's.  ``report`` prints it in a table's header and beside
every claim; the claims board ranks a claim's measurements by it (:meth:`Scale.rank`).
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from experiments.harness.command_line import load_yaml
from experiments.harness.grid_model import DATASET_ARG, Cell, Experiment, Grid

SMOKE, PAPER = "smoke", "paper"
#: what a smoke run or a run on synthetic or sample data gets instead of a verdict
NOT_A_MEASUREMENT = "checks that the grid runs, not a measurement"
#: below this share of the paper config's training budget a run checks, it does not measure
#: (a timing config's 25 of 200,000 steps)
LEAST_SHARE = 0.01
#: the data settings that set the batch (a different one changes what a step is)
BATCH_KEYS = ("batch_size", "max_tokens", "batch_tokens")
#: data paths that are not the dataset: (what the path holds, how the scale names it)
NOT_THE_DATA = (("tests/fixtures/", "synthetic data"), ("/samples/", "a sample of the data"),
                ("dummy_data", "a sample of the data"))


@dataclass(frozen=True)
class Budget:
    amount: int
    unit: str  # "steps" or "epochs"

    def __str__(self) -> str:
        return f"{self.amount:,} {self.unit}"


@dataclass(frozen=True)
class Scale:
    """What one cell's runs at ``config`` measure, against the paper config."""

    config: str
    dataset: str | None
    data: str | None  # None: the dataset itself; else what replaces it
    budget: Budget | None
    paper_budget: Budget | None
    differs: tuple[str, ...] = ()  # "model.init_args.d_model 128 (paper config: 512)"

    @property
    def measurement(self) -> bool:
        """Whether its runs measure the paper's claims: not the smoke config, the dataset
        itself, and at least :data:`LEAST_SHARE` of the paper config's budget."""
        f = self.fraction
        return (self.config != SMOKE and self.data is None
                and (f is None or f >= LEAST_SHARE))

    @property
    def fraction(self) -> float | None:
        """Our budget over the paper config's, at most 1 (None: not in the same unit)."""
        b, p = self.budget, self.paper_budget
        if b is None or p is None or b.unit != p.unit or not p.amount:
            return None
        return min(1.0, b.amount / p.amount)

    def no_verdict(self) -> str | None:
        """What a claim measured here says instead of a verdict, None when it is a
        measurement."""
        if self.data is not None:
            return f"{self.data.split(' (')[0]}: {NOT_A_MEASUREMENT}"
        if self.config == SMOKE:
            return f"smoke: {NOT_A_MEASUREMENT}"
        if not self.measurement:
            return f"{self.budget_text()}: {NOT_A_MEASUREMENT}"
        return None

    def budget_text(self) -> str:
        b, p, f = self.budget, self.paper_budget, self.fraction
        if b is None:
            return "budget not stated"
        if p is None:
            return f"{b} (the paper config states none)"
        if f is None:
            return f"{b} (the paper config's: {p})"
        if f >= 1:
            return f"the paper config's {p}"
        return f"{b.amount:,} of the paper config's {p} ({_percent(f)})"

    def short(self) -> str:
        """The claim row's scale: what is not the paper's, in a few words."""
        if self.no_verdict():
            return self.no_verdict().rsplit(":", 1)[0] + ": not a measurement"
        parts = [self.budget_text()]
        if len(self.differs) == 1:
            parts.append(self.differs[0])
        elif self.differs:
            parts.append(f"{len(self.differs)} model/batch settings not the paper config's")
        return ", ".join(parts)

    def sentence(self) -> str:
        """The table header's scale: everything :meth:`short` says, the settings named."""
        if self.no_verdict():
            what = self.data or ("the smoke config" if self.config == SMOKE
                                 else self.budget_text())
            return f"{what}: {NOT_A_MEASUREMENT} (no verdict is drawn from it)"
        text = self.budget_text()
        if self.differs:
            shown = "; ".join(self.differs[:3])
            more = f"; and {len(self.differs) - 3} more" if len(self.differs) > 3 else ""
            text += f"; not the paper config's: {shown}{more}"
        elif text.startswith("the paper config's "):
            text = f"the paper config's budget ({self.budget}), model and batch"
        else:
            text += ", the paper config's model and batch"
        return text

    def rank(self) -> tuple:
        """Most faithful first when sorted descending: a measurement, then the share of the
        paper's budget (in its unit), then the paper's model and batch."""
        return (self.measurement, self.fraction or 0.0, not self.differs)


def _percent(f: float) -> str:
    return f"{f:.0%}" if f >= 0.01 else f"{f:.1%}" if f >= 0.001 else "<0.1%"


def cell_dataset(cell: Cell) -> str | None:
    """The dataset config a cell merges (``dataset_config``), None when it merges none."""
    for arg in cell.args:
        if m := DATASET_ARG.fullmatch(arg):
            return m.group(1)
    return None


def merged_settings(experiment: Experiment, config: str, cell: Cell) -> dict:
    """The settings the config files give a cell: the grid config, the cell's dataset config
    of it and the cell's own ``--key=value`` overrides, merged in that order (as the command
    line merges them)."""
    folder = experiment.config_dir
    files = [folder / f"{config}.yaml"]
    if (name := cell_dataset(cell)) is not None:
        files.append(folder / config / f"{name}.yaml")
    merged: dict = {}
    for path in files:
        if path.exists():
            _merge(merged, load_yaml(path))
    for arg in cell.args:
        key, eq, value = arg.removeprefix("--").partition("=")
        if eq and key != "config":
            _merge(merged, _nested(key.split("."), yaml.safe_load(value)))
    return merged


def data_class_name(experiment: Experiment, config: str, cell: Cell) -> str:
    """The name of the DataModule class a cell reads at ``config``: the ``class_path`` its
    config files give the data, else the experiment's DataModule."""
    data = merged_settings(experiment, config, cell).get("data")
    if isinstance(data, dict) and data.get("class_path"):
        return str(data["class_path"]).rsplit(".", 1)[-1]
    path = experiment.unimported("datamodule_class")
    return path.rsplit(".", 1)[-1] if path else experiment.datamodule_class.__name__


def _nested(keys: list[str], value):
    return {keys[0]: _nested(keys[1:], value)} if keys else value


def _merge(into: dict, other: dict) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _leaves(tree, prefix: str = "") -> dict[str, object]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def budget(settings: dict) -> Budget | None:
    trainer = settings.get("trainer") or {}
    steps, epochs = trainer.get("max_steps"), trainer.get("max_epochs")
    if isinstance(steps, int) and steps > 0:
        return Budget(steps, "steps")
    if isinstance(epochs, int) and epochs > 0:
        return Budget(epochs, "epochs")
    return None


def data_kind(settings: dict) -> str | None:
    """What the config reads instead of the dataset (synthetic or sample files), or None."""
    for value in _leaves(settings.get("data") or {}).values():
        if isinstance(value, str):
            for mark, what in NOT_THE_DATA:
                if mark in value:
                    return f"{what} ({value})"
    return None


def compared_settings(settings: dict) -> dict[str, object]:
    """The settings whose difference from the paper config's changes the model or the batch:
    every model setting, and the data's :data:`BATCH_KEYS`."""
    out = {f"model.{k}": v for k, v in _leaves(settings.get("model") or {}).items()}
    out.update({f"data.{k}": v for k, v in _leaves(settings.get("data") or {}).items()
                if k.rsplit(".", 1)[-1] in BATCH_KEYS})
    return out


def cell_scale(experiment: Experiment, config: str, cell: Cell) -> Scale:
    ours = merged_settings(experiment, config, cell)
    paper_file = experiment.config_dir / f"{PAPER}.yaml"
    paper = merged_settings(experiment, PAPER, cell) if paper_file.exists() else None
    differs = ()
    if paper is not None and config != PAPER:
        a, b = compared_settings(ours), compared_settings(paper)
        differs = tuple(f"{key.replace('.init_args', '')} {a[key]} (paper config: {b[key]})"
                        for key in sorted(set(a) & set(b)) if a[key] != b[key])
    return Scale(config, cell_dataset(cell), data_kind(ours), budget(ours),
                 budget(paper) if paper is not None else None, differs)



def grid_scales(experiment: Experiment, grid: Grid, config: str) -> dict[str, Scale]:
    """cell name -> its scale at ``config``."""
    return {cell.name: cell_scale(experiment, config, cell) for cell in grid.cells}


def scale_line(experiment: Experiment, grid: Grid, config: str) -> str:
    """The header line of a table: the scale of the grid's cells at ``config`` (by dataset
    where the datasets' scales differ)."""
    by_text: dict[str, list[str]] = {}
    for scale in grid_scales(experiment, grid, config).values():
        names = by_text.setdefault(scale.sentence(), [])
        if scale.dataset and scale.dataset not in names:
            names.append(scale.dataset)
    if len(by_text) == 1:
        return f"Scale: {next(iter(by_text))}."
    return "Scale: " + "; ".join(f"{', '.join(names) or 'other cells'}: {text}"
                                 for text, names in by_text.items()) + "."

