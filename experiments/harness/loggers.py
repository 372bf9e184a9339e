"""W&B and CSV logging of the suite's runs, after Lightning's loggers: every run writes its
metrics to ``runs/<experiment>/<group>/<name>/metrics.csv`` (what ``report`` reads) and,
unless ``--run.wandb false``, to W&B (:class:`RunLogger`), online only when W&B can be
reached (:func:`wandb_mode`); a test's per-example predictions become W&B tables
(:func:`log_predictions`); a grid's table becomes one summary run after its cells
(experiments/harness/wandb_summary.py).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import numbers
import os
import sys
import warnings
from datetime import datetime
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from experiments.harness.grid_model import Experiment, runs_root
from experiments.harness.runs import read_run
from fileio import write_atomic


def wandb_project() -> str:
    """The W&B project of every run: ``$WANDB_PROJECT``, else ``attnrepro``."""
    return os.environ.get("WANDB_PROJECT", "attnrepro")


def wandb_mode() -> str:
    """``WANDB_MODE`` if set (``disabled``: W&B writes nothing); else online only when an API
    key is configured for the W&B server and the server answers, otherwise offline (the run
    folder keeps the offline run; ``wandb sync`` uploads it later): a run never waits for
    the network or fails for lack of it (measured with wandb 0.31, a key and no network: an
    online ``wandb.init`` waited 101 s and then failed with a CommError)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    host = wandb_host()
    if not (os.environ.get("WANDB_API_KEY") or _netrc_has(host)):
        return "offline"
    if _reachable(host):
        return "online"
    if not _WARNED_OFFLINE:
        _WARNED_OFFLINE.append(host)
        print(f"W&B: {host} is not reachable: logging offline under the run folder "
              "(upload later with `wandb sync`)", file=sys.stderr)
    return "offline"


_WARNED_OFFLINE: list[str] = []


def wandb_host() -> str:
    """The W&B server a run would talk to, as W&B itself resolves it: ``WANDB_BASE_URL``, else
    the host saved by ``wandb login --host`` (its settings file), else its default (which
    changes between W&B releases: api.wandb.ai before, api.forge.coreweave.com in 0.31)."""
    try:
        import wandb

        settings = wandb.Settings(quiet=True)  # W&B's own start prints the files it reads
        # the settings file as wandb.setup() finds it (not started here: it spawns a service)
        config = Path(os.environ.get("WANDB_CONFIG_DIR") or "~/.config/wandb").expanduser()
        settings.settings_system = str(config / "settings")
        settings.update_from_system_settings()
        settings.update_from_env_vars(dict(os.environ))  # the variables win over the files
        return str(settings.base_url)
    except Exception:  # a W&B release without these methods: the documented variable
        return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def _netrc_has(url: str) -> bool:
    """Whether the netrc file W&B reads (``$NETRC`` or ~/.netrc) holds a key for the server of
    ``url`` (where ``wandb login`` saves it)."""
    import netrc
    from urllib.parse import urlparse

    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return netrc.netrc(str(path)).authenticators(urlparse(url).hostname or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the server of ``url`` opens within ``timeout`` s."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def make_loggers(experiment: Experiment, run, model, config, subcommand: str = "fit") -> list:
    """The run's loggers: CSV (``runs/<experiment>/<group>/<name>/metrics.csv``) and, unless
    ``--run.wandb false``, W&B (:class:`RunLogger`) in the group ``<experiment>/<group>``."""
    name = run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    save_dir = runs_root() / experiment.name
    run_dir = save_dir / run.group / name
    run_dir.mkdir(parents=True, exist_ok=True)
    resumed = resumed_from(config.get("ckpt_path")) if subcommand == "fit" else None
    earlier_rows = []
    if resumed and resumed["run_dir"] == run_dir.resolve():
        # the CSV logger deletes the folder's metrics.csv: keep the rows before the checkpoint
        earlier_rows = metrics_before(run_dir / "metrics.csv", resumed["global_step"])
    loggers = [start_csv_logger(RunCSVLogger(save_dir=save_dir, name=run.group, version=name,
                                             earlier_rows=earlier_rows))]
    if run.wandb:
        tags = [experiment.name, run.group] + [m.tag() for m in getattr(model, "mechanisms",
                                                                        {}).values()]
        seed = config.get("seed_everything")
        identity = {"experiment": experiment.name, "grid": run.grid, "cell": run.cell,
                    "seed": seed if isinstance(seed, int) and not isinstance(seed, bool)
                    else None}
        loggers.append(RunLogger(
            identity=identity, project=wandb_project(),
            group=f"{experiment.name}/{run.group}", name=name, save_dir=str(run_dir),
            job_type="train" if subcommand == "fit" else "eval", mode=wandb_mode(),
            tags=sorted(set(tags)), config={**config.as_dict(), **identity},
            settings=wandb_settings(),
            # a resumed fit goes on in the W&B run of its checkpoint's run folder
            **({"id": resumed["wandb_id"], "resume": "allow"}
               if resumed and resumed["wandb_id"] else {})))
    return loggers


def resumed_from(ckpt_path) -> dict | None:
    """What a fit resumed from ``ckpt_path`` continues: the checkpoint's ``global_step``, its
    run folder (``<run>/checkpoints/<file>.ckpt``) and the id of that run's latest W&B run
    (None when it had none)."""
    if not ckpt_path or str(ckpt_path) in ("last", "best", "hpc", "registry"):
        return None
    import torch

    path = Path(ckpt_path).resolve()
    step = torch.load(path, map_location="cpu", weights_only=True).get("global_step", 0)
    folder = path.parent.parent
    runs = sorted((folder / "wandb").glob("*run-*-*"), key=lambda d: d.stat().st_mtime)
    runs = [d for d in runs if d.is_dir()]
    return {"global_step": int(step), "run_dir": folder,
            "wandb_id": runs[-1].name.rsplit("-", 1)[1] if runs else None}


def metrics_before(path: Path, global_step: int) -> list[dict]:
    """The rows of a Lightning metrics.csv logged before optimiser step ``global_step`` (a
    row's ``step`` is the number of steps done before it minus one), empty cells dropped."""
    if not path.exists():
        return []
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("step") not in (None, "") and int(float(row["step"])) < global_step:
                rows.append({k: float(v) if k != "epoch" and k != "step" else int(float(v))
                             for k, v in row.items() if v not in ("", None)})
    return rows


class AtomicMetricsWriter(ExperimentWriter):
    """Lightning's CSV writer, but ``metrics.csv`` is replaced whole (:func:`fileio.write_atomic`)
    at every save instead of appended to or rewritten in place: a run stopped at any moment
    (SIGTERM during a save) leaves the file of its previous save, never a half-written row or
    a header rewrite that lost the rows.  The same bytes as Lightning's writer (sorted columns,
    csv's ``\\r\\n`` rows).  ``earlier_rows``: a resumed fit's rows before its checkpoint
    (:func:`metrics_before`); the folder's file is then kept until the first save replaces it,
    where Lightning's writer deletes it at once (a stop before that save lost them)."""

    def __init__(self, log_dir: str, earlier_rows: list[dict] | None = None) -> None:
        self.rows: list[dict] = list(earlier_rows or [])  # every row of the file, in order
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        if not self.rows:  # a new run: Lightning's warning and deletion of an earlier file
            super()._check_log_dir_exists()

    def save(self) -> None:
        if not self.metrics:
            return
        self.rows += self.metrics
        self.metrics = []
        self.metrics_keys = sorted(set().union(*self.rows))
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self.metrics_keys)
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomic(self.metrics_file_path, text.getvalue().encode())


class RunCSVLogger(CSVLogger):
    """Lightning's CSVLogger writing through :class:`AtomicMetricsWriter`."""

    def __init__(self, *args, earlier_rows: list[dict] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._earlier_rows = earlier_rows

    @property
    @rank_zero_experiment
    def experiment(self) -> AtomicMetricsWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AtomicMetricsWriter(self.log_dir, self._earlier_rows)
        return self._experiment


def start_csv_logger(logger):
    """The CSV logger with its writer created now, before anything else of the run (W&B)
    writes into the run folder.  Its warning that the folder "exists and is not empty" is
    kept for what it means, the metrics of an earlier run with this name being replaced; a
    folder holding only the grid's ``output.log`` of this run is not that."""
    folder = Path(logger.log_dir)
    earlier = any((folder / f).exists() for f in ("metrics.csv", "hparams.yaml"))
    with warnings.catch_warnings():
        if not earlier:
            warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists "
                                                      r"and is not empty")
        logger.experiment  # noqa: B018 - creates the writer (rank zero only)
    return logger


#: what a W&B run's summary keeps of a validation metric (by the name after ``val/``, or
#: its first part before ``_<suffix>``: ``acc_mismatched``, ``acc_best``, ``loss_<split>``)
BEST = {"max": ("acc", "map", "mrr", "p@1", "bleu", "sacrebleu", "exact_match"),
        "min": ("loss", "perplexity", "ppl")}


def metric_summary(key: str) -> str | None:
    """The W&B summary of a logged metric: ``val/*`` by their best (``max`` or ``min``,
    :data:`BEST`), ``test/*`` by their last; None (W&B's default, the last value) for the
    others and for a value taken at another metric's best (``val/mrr_at_best_map``)."""
    stage, _, name = key.partition("/")
    if stage == "test":
        return "last"
    if stage != "val" or "_at_best" in name:
        return None
    for summary, names in BEST.items():
        if any(name == n or name.startswith(f"{n}_") for n in names):
            return summary
    return None


class RunLogger(WandbLogger):
    """Lightning's WandbLogger with the suite's dashboard: ``identity`` (experiment, grid,
    cell, seed) stays on the run's config (a DataModule's recorded ``seed``, its data seed,
    is logged as ``data_seed``); each metric's summary is defined (:func:`metric_summary`)
    before its first value, by its exact name: Lightning defines the glob ``*`` (the step
    axis) and W&B picks any one of several matching globs, while a name beats a glob."""

    #: the hyper-parameters renamed on W&B when they would overwrite the run's identity
    RENAMED = {"seed": "data_seed"}

    def __init__(self, *args, identity: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # Lightning passes anonymous=None to wandb.init, which W&B warns has no effect
        self._wandb_init.pop("anonymous", None)
        self._identity = dict(identity or {})
        self._summarised: set[str] = set()

    def log_hyperparams(self, params) -> None:
        params = vars(params) if isinstance(params, argparse.Namespace) else dict(params)
        params = {self.RENAMED.get(k, f"hparams/{k}") if k in self._identity else k: v
                  for k, v in params.items()}
        super().log_hyperparams(params)

    def log_metrics(self, metrics, step=None) -> None:
        for key, value in metrics.items():
            if key in self._summarised:
                continue
            self._summarised.add(key)
            summary = metric_summary(key)
            scalar = isinstance(value, numbers.Real) or getattr(value, "ndim", None) == 0
            if summary and scalar and not isinstance(value, bool):
                self.experiment.define_metric(key, summary=summary,
                                              step_metric="trainer/global_step", step_sync=True)
        super().log_metrics(metrics, step)


def wandb_settings(init_timeout: int = 120):
    import wandb

    return wandb.Settings(init_timeout=init_timeout, silent=True, console="off")


def finish_wandb() -> None:
    import wandb

    if wandb.run is not None:
        wandb.finish()


#: rows of a predictions file logged to W&B (the summary says how many the file has)
PREDICTION_ROWS = 10_000


def read_predictions(path: Path, limit: int = PREDICTION_ROWS) -> tuple[list, list, int]:
    """(columns, rows, total rows) of a JSON-lines file, at most ``limit`` rows: the columns
    are the keys in order of first appearance; nested objects become JSON text."""
    columns: dict[str, None] = {}
    records, total = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            total += 1
            if len(records) < limit:
                record = json.loads(line)
                columns.update(dict.fromkeys(record))
                records.append(record)
    rows = [[json.dumps(v) if isinstance(v, dict) else v for v in (r.get(c) for c in columns)]
            for r in records]
    return list(columns), rows, total


def log_predictions(trainer, since: float | None = None) -> None:
    """After a test: each predictions file it wrote into the run folder as a W&B table
    (the run record's predictions files; the first :data:`PREDICTION_ROWS` rows, the summary's
    ``<key>_rows`` and ``<key>_logged_rows`` say how many there are and how many were
    logged).  A table that cannot be logged is a warning, never a failed run."""
    loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
    if not loggers:
        return
    log_dir = trainer.log_dir  # a broadcast under DDP: every process asks
    if not trainer.is_global_zero or not log_dir:
        return
    import wandb

    for key, path in read_run(log_dir).predictions(since).items():
        try:
            columns, rows, total = read_predictions(path)
            table = wandb.Table(columns=columns, data=rows, allow_mixed_types=True)
            for lg in loggers:
                lg.log_metrics({key: table}, step=trainer.global_step)
                lg.experiment.summary.update({f"{key}_rows": total,
                                              f"{key}_logged_rows": len(rows)})
        except Exception as err:  # noqa: BLE001 - the metrics are logged; the table is extra
            warnings.warn(f"{path.name} not logged to W&B: {type(err).__name__}: {err}",
                          stacklevel=2)

