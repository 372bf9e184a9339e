"""The grid model: an experiment script's declaration of its paper tables.

An :class:`Experiment` names its LightningModule and DataModule, the links between them and
its grids; a :class:`Grid` is a paper table, a list of :class:`Cell` (a row: the CLI
overrides that make it, and the paper's numbers).  Every module of experiments/ may import
this one; it imports none of them: a script hands its ``EXPERIMENT`` to the entry point,
experiments/harness/runner.py's ``main``.

An experiment script names its classes by path (``"lit_models.transformer.TransformerSeq2Seq"``),
imported when first read (:class:`ImportedClass`): the script imports no torch, so its
``--help``, ``grid``, ``report`` and argument errors start at once (issue 31 item 9).

Where runs live: ``runs/<experiment>/<grid>-<config>/<cell>-seed<k>/`` under
``$ATTNREPRO_RUNS`` (default: the project's ``runs/``).
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from experiments.harness.slice_model import Slicing

PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: how a cell merges a dataset's config of the grid config (:func:`dataset_config`)
DATASET_ARG = re.compile(r"--config=\{config\}/(\w+)\.yaml")


def runs_root() -> Path:
    return Path(os.environ.get("ATTNREPRO_RUNS", PROJECT_ROOT / "runs"))


def shown_path(path: Path | str) -> str:
    """A path as the user would type it: relative to the project root when inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


@dataclass
class Cell:
    """One row of a paper table: the CLI overrides that make it, and the paper's numbers
    (metric label -> number in the paper's units).

    ``{config}`` in an argument stands for the grid config's path without ``.yaml``, so a
    cell can merge a config file of its own for each grid config (a table column on another
    dataset): ``--config={config}/sst.yaml`` reads ``configs/<name>/paper/sst.yaml`` under
    ``--config paper`` and ``configs/<name>/smoke/sst.yaml`` under ``--smoke``.  Write it
    as ``dataset_config("sst")``, the one way a cell says which dataset it runs on.
    """

    name: str
    args: list[str] = field(default_factory=list)
    paper: dict[str, float | None] = field(default_factory=dict)


def dataset_config(name: str) -> list[str]:
    """The override that merges dataset ``name``'s config of the grid config
    (``configs/<experiment>/<config>/<name>.yaml``; see :class:`Cell`)."""
    return [f"--config={{config}}/{name}.yaml"]


@dataclass
class Grid:
    """A paper table as a named grid of flag values."""

    name: str
    title: str
    #: column label -> logged metric key, e.g. {"Acc": "test/exact_match"}; a key
    #: ``hparams/<name>`` reads the run's hparams.yaml (e.g. ``hparams/n_parameters``)
    metrics: dict[str, str]
    cells: list[Cell]
    scale: float = 100.0  # logged fraction -> the paper's units (percent)
    #: per column label, a scale other than ``scale`` (e.g. {"Params (M)": 1e-6})
    scales: dict[str, float] = field(default_factory=dict)
    #: per column label, a baseline cell: the report adds that column divided by the
    #: baseline's, the paper's and ours (e.g. {"Steps/s": "transformer"}: DW's 0.87x)
    relative_to: dict[str, str] = field(default_factory=dict)
    note: str = ""
    goal: str = "maximize"  # of the first metric, for the W&B sweep ("minimize": perplexity)
    #: the validation metric whose learning curve ``report --curve`` tabulates per step
    curve: str | None = None
    #: the comparisons the paper claims, (baseline cell, proposal cell): ``report`` tests
    #: each on the per-example test predictions of the runs (experiments/harness/significance.py)
    claims: list[tuple[str, str]] = field(default_factory=list)
    #: the cells' training cost measured with the models taking turns in one process, a JSONL
    #: that ``python -m benchmarks.model_cost --out`` writes (path relative to the project
    #: root): ``report`` prints it after the table, ``report --plot`` draws each claim's
    #: difference against it (experiments/harness/interleaved_cost.py)
    cost_file: str | None = None

    def __post_init__(self):
        names = {c.name for c in self.cells}
        for pair in self.claims:
            unknown = [n for n in pair if n not in names]
            if unknown or len(pair) != 2:
                raise ValueError(f"grid {self.name!r}: claim {pair!r} must name two of its "
                                 f"cells ({', '.join(sorted(names))})")

    def scale_of(self, label: str) -> float:
        return self.scales.get(label, self.scale)

    def cell(self, name: str) -> Cell:
        for c in self.cells:
            if c.name == name:
                return c
        raise SystemExit(f"grid {self.name!r} has no cell {name!r}; cells: "
                         f"{', '.join(c.name for c in self.cells)}")


#: what a cost grid's Steps/s and Step MB are (lit_models/base.py measures both)
COST_NOTE = ("Steps/s: optimiser steps per second of training-step time (forward, backward, "
             "update; data loading excluded; lit_models/base.py); Step MB: the training "
             "loop's resident-set peak beyond what was in memory when it began (activations, "
             "gradients, temporaries).")


def cost_grid(title: str, baseline: str, cells: list[Cell], note: str = "") -> Grid:
    """Grid ``cost``: DW Table 4's measure for each cell, parameters, training steps/s and
    training-loop memory, the last two also relative to the ``baseline`` cell (issue 18).
    Run it one cell at a time (--jobs 1), so no two runs share the cores."""
    return Grid(name="cost", title=title,
                metrics={"Params (M)": "hparams/n_parameters",
                         "Steps/s": "train/steps_per_second",
                         "Step MB": "train/step_memory_mb"},
                cells=cells, scale=1.0, scales={"Params (M)": 1e-6},
                relative_to={"Steps/s": baseline, "Step MB": baseline},
                note=" ".join(filter(None, (COST_NOTE, note))))


def import_class(path: str) -> type:
    """The class ``module.Class`` names, imported."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class ImportedClass:
    """A field of :class:`Experiment` holding a class, given as the class or as its path
    ``"module.Class"``: a path is imported when the field is first read, and the class kept
    from then on."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:  # on the class: the dataclass field has no default
            raise AttributeError(self.name)
        value = obj.__dict__[self.name]
        if isinstance(value, str):
            value = obj.__dict__[self.name] = import_class(value)
        return value

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.name] = value


@dataclass
class Experiment:
    """An experiment script: its LightningModule, DataModule, links between them, and the
    paper's tables as grids.  ``model_class`` and ``datamodule_class`` are classes or their
    paths ``"module.Class"``, imported when first read (:class:`ImportedClass`)."""

    name: str
    model_class: type | str = ImportedClass()
    datamodule_class: type | str = ImportedClass()
    grids: dict[str, Grid]
    links: list[tuple[str, str]] = field(default_factory=list)  # (data attribute, model arg)
    subclass_mode_model: bool = False
    subclass_mode_data: bool = False  # the config names the DataModule (class_path)
    script: Path | None = None
    #: subclasses of the model or DataModule class in modules of their own that a command
    #: line may name by class name alone (``--model=Mixture``, ``--data.help
    #: SSTDataModule``), as paths: LightningCLI finds such a name among the subclasses
    #: imported, so :meth:`imported_classes` imports them first
    subclasses: list[str] = field(default_factory=list)
    #: the test set's slices (name -> :class:`Slicing`) that ``report --slices`` tests each
    #: claim in, all of them when no name is given (experiments/harness/slice_model.py)
    slices: dict[str, Slicing] = field(default_factory=dict)

    def unimported(self, role: str) -> str | None:
        """The path of ``model_class`` or ``datamodule_class`` (``role``) while it is not
        imported yet (read without importing it); None once it is a class."""
        value = self.__dict__[role]
        return value if isinstance(value, str) else None

    def imported_classes(self) -> tuple[type, type]:
        """The model and DataModule classes, imported with :attr:`subclasses` (what
        LightningCLI is given)."""
        for path in self.subclasses:
            import_class(path)
        return self.model_class, self.datamodule_class

    @property
    def config_dir(self) -> Path:
        return PROJECT_ROOT / "experiments" / "configs" / self.name

    def configs(self) -> list[str]:
        """The config names: the yaml files of configs/<name>/ (never a sweep file)."""
        return sorted(p.stem for p in self.config_dir.glob("*.yaml")
                      if not p.stem.startswith("sweep-"))

    def config_path(self, config: str) -> Path:
        path = Path(config)
        if path.suffix in (".yaml", ".yml"):
            return path
        path = self.config_dir / f"{config}.yaml"
        if not path.exists() or config not in self.configs():
            raise SystemExit(f"{self.name} has no config {config!r}; configs: "
                             f"{', '.join(self.configs())} "
                             f"({shown_path(self.config_dir)}/<config>.yaml)")
        return path

    def dataset_names(self) -> list[str]:
        """The datasets the grids' cells merge (``dataset_config``), in order of first use."""
        names: list[str] = []
        for grid in self.grids.values():
            for cell in grid.cells:
                for arg in cell.args:
                    m = DATASET_ARG.fullmatch(arg)
                    if m and m.group(1) not in names:
                        names.append(m.group(1))
        return names

    def datasets_in(self, folder: Path) -> list[str]:
        """The dataset configs of a config's folder (``<config>/<dataset>.yaml``), those the
        grids use first, in their order."""
        stems = {p.stem for p in Path(folder).glob("*.yaml")}
        used = [n for n in self.dataset_names() if n in stems]
        return used + sorted(stems - set(used))

    def grid_folder(self, grid: Grid, config: str) -> Path:
        """The folder of ``grid``'s runs with ``config``: ``runs/<experiment>/<grid>-<config>``."""
        return runs_root() / self.name / group_name(grid, config)

    def grid(self, name: str) -> Grid:
        if name not in self.grids:
            raise SystemExit(f"{self.name} has no grid {name!r}; grids: {', '.join(self.grids)}")
        return self.grids[name]

    def slicings(self, names: list[str]) -> list[Slicing]:
        """The declared slicings ``names`` (all of them for none), or one line naming the
        unknown ones and the known ones."""
        if not self.slices:
            raise SystemExit(f"{self.name} declares no slices (its script's "
                             "Experiment(slices=...))")
        unknown = [n for n in names if n not in self.slices]
        if unknown:
            raise SystemExit(f"{self.name} has no slice {', '.join(map(repr, unknown))}; "
                             f"slices: {', '.join(self.slices)}")
        return [self.slices[n] for n in dict.fromkeys(names or self.slices)]


#: a grid run's folder is ``<cell><SEED><k>`` (``coda-seed0``)
SEED = "-seed"


def group_name(grid: Grid, config: str) -> str:
    """The run group of ``grid``'s cells under ``config``: ``<grid>-<config>``."""
    return f"{grid.name}-{config}"


def run_name(cell: Cell, seed: int) -> str:
    """The name (and folder) of ``cell``'s run with ``seed``: ``<cell>-seed<k>``."""
    return f"{cell.name}{SEED}{seed}"


def seed_of(run: Path, cell: Cell) -> int | None:
    """The seed of the run folder ``run`` of ``cell`` (``coda-seed3``: 3); None for a folder
    of another cell, also one whose name starts with this one's (``coda_encoder-seed0``)."""
    prefix = f"{cell.name}{SEED}"
    rest = run.name[len(prefix):] if run.name.startswith(prefix) else ""
    return int(rest) if rest.isdecimal() else None


def cell_runs(root: Path, cell: Cell) -> list[Path]:
    """The run folders of ``cell``'s seeds under a grid's folder, in name order."""
    return [d for d in sorted(root.glob(f"{cell.name}{SEED}*")) if seed_of(d, cell) is not None]


#: the run locks this process holds (group folder, run name) -> open lock file
_HELD_RUNS: dict[tuple[str, str], IO[str]] = {}


def run_lock(root: Path, run: str) -> IO[str] | None:
    """An exclusive lock on the run folder ``root/run`` (``root/.<run>.lock``, the holder's
    pid written in it), held until the returned file is closed or the process ends; None when
    another process holds it.  A grid or ``cell`` holds it while its run goes on, and the run
    itself (``fit``) takes it when nothing launched it: two processes never write one run
    folder."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / f".{run}.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


def lock_holder(root: Path, run: str) -> str:
    """Who holds the lock of ``root/run``, as its file says (``pid N``; the holder writes it
    just after locking, so an empty file is read again for a moment)."""
    import time

    for _ in range(50):
        try:
            said = (root / f".{run}.lock").read_text().strip()
        except OSError:
            break
        if said:
            return said
        time.sleep(0.01)
    return "another process"


def claim_run(root: Path, name: str | None, stamp: str) -> str:
    """The name of a run folder under ``root`` that this process alone writes, locked
    (:func:`run_lock`) until it ends.  ``name`` given: that run, whose lock this process or
    the grid or ``cell`` that launched it (its parent) may hold; held by any other process
    it is refused in one line.  ``name`` None: ``stamp`` (a time stamp), or ``<stamp>-2``,
    ``-3``, ... when runs started in the same second hold or have that name."""
    if name is not None:
        if (str(root), name) in _HELD_RUNS:
            return name
        handle = run_lock(root, name)
        if handle is None and lock_holder(root, name) != f"pid {os.getppid()}":
            raise RunFolderBusy(f"run folder {root / name} is being written by "
                                f"{lock_holder(root, name)}; wait for it to end or choose "
                                "another --run.name")
        if handle is not None:
            _HELD_RUNS[(str(root), name)] = handle
        else:  # the launcher's: this run takes it over if the launcher dies before it ends
            threading.Thread(target=_take_over, args=(root, name), daemon=True).start()
        return name
    for n in range(1, 1000):
        candidate = stamp if n == 1 else f"{stamp}-{n}"
        if (root / candidate).exists() or (str(root), candidate) in _HELD_RUNS:
            continue
        handle = run_lock(root, candidate)
        if handle is not None and not (root / candidate).exists():
            _HELD_RUNS[(str(root), candidate)] = handle
            return candidate
        if handle is not None:
            handle.close()
    raise RunFolderBusy(f"no free run name {stamp}-N under {root}")


def _take_over(root: Path, name: str) -> None:
    """Wait for the run lock the launcher (grid or ``cell``) holds and hold it from then on:
    a launcher killed outright (SIGKILL) leaves its run going on in its own session, and a
    new grid must not start the same run beside it."""
    import fcntl

    handle = open(root / f".{name}.lock", "a+")
    fcntl.flock(handle, fcntl.LOCK_EX)  # blocks until the launcher lets go
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    _HELD_RUNS[(str(root), name)] = handle


class RunFolderBusy(RuntimeError):
    """Another process writes the run folder asked for."""
