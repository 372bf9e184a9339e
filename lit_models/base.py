"""What every LightningModule of the suite shares: the optimiser and its schedule, the
parameter count, the training speed, the attention tags logged with each run, and the stop
on a NaN or infinite training loss."""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar, Literal

import lightning as L
import torch

from attention import Mechanism
from fileio import write_atomic


def gather_objects(obj) -> list:
    """``obj`` of every process (picklable), in rank order; ``[obj]`` in a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, obj)
        return gathered
    return [obj]


def peak_memory_mb(device: torch.device) -> float:
    """The peak memory of this process so far, in MB: on a CUDA device torch's peak of
    allocated tensor bytes; on the CPU the process's peak resident set (getrusage's
    ru_maxrss: tensors, data, Python and libraries, every thread)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _proc_status_kb(*keys: str) -> dict[str, int] | None:
    try:
        with open("/proc/self/status") as f:
            found = {line.split(":")[0]: int(line.split()[1]) for line in f
                     if line.split(":")[0] in keys}
    except (OSError, ValueError, IndexError):
        return None
    return found if len(found) == len(keys) else None


def start_memory_window() -> float | None:
    """On Linux (CPU): resets the kernel's resident-set high-water mark of this process and
    returns the resident set now (MB), so that :func:`memory_since_mb` gives the training
    loop's own peak; None where the mark cannot be reset (then the peak is the process's)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    status = _proc_status_kb("VmRSS")
    return None if status is None else status["VmRSS"] / 1024


def memory_since_mb(start_mb: float | None) -> float | None:
    """The resident-set peak since :func:`start_memory_window` minus the resident set then
    (MB): what the training steps held beyond the model, optimiser state and data already in
    memory (activations, gradients, temporaries, thread stacks); None if unknown."""
    status = None if start_mb is None else _proc_status_kb("VmHWM")
    return None if status is None else max(0.0, status["VmHWM"] / 1024 - start_mb)


#: CPU features whose presence changes which kernels run (/proc/cpuinfo flag names)
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_host(cpuinfo: str | None = None) -> dict:
    """The CPU under the run: its model name and, per :data:`CPU_FEATURES`, whether the CPU
    has it (from /proc/cpuinfo, or the text given; 'unknown' where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    flags = set(fields.get("flags", "").split())
    model = fields.get("model name") or platform.processor() or platform.machine() or "unknown"
    return {"machine/cpu_model": model,
            **{f"machine/cpu_has_{f}": (f in flags) if flags else "unknown"
               for f in CPU_FEATURES}}


def machine_settings() -> dict:
    """What else a run's numbers depend on, beside its config and seed: torch's version, its
    thread count (reductions split across threads add in another order), the CPU (its model
    and the features that pick kernels: :func:`cpu_host`) and the kernels' instruction set
    torch dispatched to, whether torch.compile'd kernels are asked for
    (``ATTNREPRO_COMPILE``; their eager fallbacks, also taken where compiling fails, with a
    warning, sum in another order), and deterministic mode."""
    from attention._compiled import COMPILE

    return {"machine/torch": str(torch.__version__), "machine/threads": torch.get_num_threads(),
            **cpu_host(),
            "machine/cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine/compile": COMPILE,
            "machine/deterministic": torch.are_deterministic_algorithms_enabled()}


def random_states() -> dict:
    """torch's (CPU and CUDA), Python's and numpy's random states, as tensors, ints and
    tuples only (a checkpoint stays loadable with ``torch.load(weights_only=True)``)."""
    import random

    import numpy as np

    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": random.getstate(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos),
                      int(has_gauss), float(gauss))}


def set_random_states(states: dict) -> None:
    """Restores what :func:`random_states` returned."""
    import random

    import numpy as np

    torch.set_rng_state(states["torch"])
    if states.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN or infinite training loss (:meth:`AttnReproModule.
    on_before_backward`), or on another non-finite quantity a model checks before its loss
    exists (:meth:`AttnReproModule.stop_if_not_finite`: the latent mixture's routing
    distribution and reward).  The message is one line naming the quantity, the step and the
    last finite loss, e.g. ``training loss is nan at step 137 (last finite loss 2.4051 at
    step 136); ...``.  ``step`` is ``trainer.global_step`` (the optimiser steps taken before
    it: the step the batch's ``train/loss`` is logged at), ``loss`` the value (None when
    another process's was the one), ``last_finite`` (step, loss) or None, ``what`` the
    quantity."""

    def __init__(self, loss: float | None, step: int, last_finite: tuple[int, float] | None,
                 what: str = "training loss"):
        self.loss, self.step, self.last_finite, self.what = loss, step, last_finite, what
        value = "not finite in another process" if loss is None else str(loss)  # nan, inf
        before = ("no finite loss before it in this run" if last_finite is None
                  else f"last finite loss {last_finite[1]:.4f} at step {last_finite[0]}")
        super().__init__(f"{what} is {value} at step {step} ({before}); training "
                         "stopped before this step's backward pass and update")


class AttnReproModule(L.LightningModule):
    """Base class.  Subclasses call ``super().__init__(lr=..., ...)`` with their optimiser
    settings and set ``self.mechanisms`` (name -> Mechanism) for the run's tags; their test
    steps hand each example's prediction to :meth:`keep_predictions`."""

    #: what a test run writes beside its metrics (experiments/harness/runner.py names it)
    predictions_file: ClassVar[str] = "predictions-test.jsonl"

    def __init__(self, lr: float = 1e-3, weight_decay: float = 0.0,
                 schedule: Literal["constant", "inverse_sqrt", "linear"] = "constant",
                 warmup_steps: int = 0, betas: tuple[float, float] = (0.9, 0.98),
                 max_steps_for_schedule: int | None = None):
        super().__init__()
        self.optim = dict(lr=lr, weight_decay=weight_decay, schedule=schedule,
                          warmup_steps=warmup_steps, betas=betas,
                          max_steps=max_steps_for_schedule)
        self.mechanisms: dict[str, Mechanism] = {}
        self.means = torch.nn.ModuleDict()  # log_mean's metrics, by logged name
        self._prediction_rows: dict[int, list[dict]] = {}  # keep_predictions -> test files
        self._last_finite_loss: tuple[int, float] | None = None  # (step, training loss)

    def log_mean(self, name: str, value: torch.Tensor, weight: int | float | torch.Tensor,
                 **kwargs) -> None:
        """Log ``name`` as the ``weight``-weighted mean of ``value`` over the epoch and over
        every process (a torchmetrics MeanMetric: its sums are gathered, so the result is the
        mean over the whole evaluation set, whatever each process's share)."""
        from torchmetrics import MeanMetric

        key = name.replace("/", "__").replace("@", "_at_")
        if key not in self.means:
            self.means[key] = MeanMetric().to(self.device)
        self.means[key].update(value.detach(), weight=weight)
        self.log(name, self.means[key], metric_attribute=f"means.{key}", **kwargs)

    def _datamodule(self):
        """The DataModule of the run this model is in (None outside a Trainer or without one):
        where the predictions files find tokenizers, source texts and file lines."""
        return getattr(self._trainer, "datamodule", None) if self._trainer else None

    def vocab_words(self, ids: torch.Tensor, mask: torch.Tensor) -> list:
        """Each row's text for a predictions file: the words of its token ids where ``mask``
        (B,L) is True, by the DataModule's vocabulary (``vocab.itos``), joined by spaces; the
        ids when the model runs without such a DataModule."""
        itos = getattr(getattr(self._datamodule(), "vocab", None), "itos", None)
        rows = [[t for t, real in zip(row, keep) if real]
                for row, keep in zip(ids.tolist(), mask.tolist())]
        return [" ".join(itos[t] for t in row) for row in rows] if itos else rows

    # -- per-example test predictions (predictions-test[_<split>].jsonl in the run folder)
    def keep_predictions(self, rows: Iterable[dict], dataloader_idx: int = 0) -> None:
        """Keep this test batch's rows for :meth:`write_predictions`: one JSON-able dict per
        example, with ``id`` = the example's position in its split (file order)."""
        self._prediction_rows.setdefault(dataloader_idx, []).extend(rows)

    def write_predictions(self, suffix: Callable[[int], str] = lambda idx: "") -> list[Path]:
        """Write the rows kept since the last call, gathered from every process, to
        ``predictions-test<suffix(dataloader_idx)>.jsonl`` in the run folder: one line per
        example in ``id`` order, each example once (a distributed sampler's repeated
        examples are dropped: the first row of an id is kept).  Returns the files written
        (none off rank 0 or without a log folder)."""
        kept, self._prediction_rows = self._prediction_rows, {}
        gathered = gather_objects(kept)
        if self._trainer is None:
            return []
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every process asks
        if not self.trainer.is_global_zero or not log_dir:
            return []
        written = []
        for idx in sorted({i for part in gathered for i in part}):
            rows: dict[int, dict] = {}
            for part in gathered:
                for row in part.get(idx, []):
                    rows.setdefault(int(row["id"]), row)
            path = Path(log_dir) / f"predictions-test{suffix(idx)}.jsonl"
            write_atomic(path, "".join(json.dumps(rows[k]) + "\n" for k in sorted(rows)))
            written.append(path)
        return written

    def on_test_epoch_start(self) -> None:
        self._prediction_rows = {}

    def on_test_epoch_end(self) -> None:
        self.write_predictions()

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    #: training steps not timed at the start of a run (allocation, compilation, caches)
    untimed_steps = 5

    def on_fit_start(self) -> None:
        tags = {f"attention/{k}": m.tag() for k, m in self.mechanisms.items()}
        for logger in self.loggers:
            logger.log_hyperparams({"n_parameters": self.n_parameters(), **tags,
                                    **machine_settings()})
        self._speed = {"steps": -self.untimed_steps, "seconds": 0.0, "start": None}

    def on_train_start(self) -> None:
        self._fit_started = time.perf_counter()
        # a resumed run adds the training time its checkpoint's segments took
        self._wall_before = getattr(self, "_wall_restored", 0.0)
        # the process's peak so far (resetting the kernel's high-water mark lowers getrusage's)
        self._peak_before = peak_memory_mb(self.device)
        self._memory_start = (start_memory_window() if self.device.type == "cpu"
                              else torch.cuda.memory_allocated(self.device) / 2**20)

    def on_train_end(self) -> None:
        """Logs the run's cost beside its quality (every report shows it): ``train/wall_seconds``,
        the training loop's wall time (validation included, the test not; a resumed run's
        counts the earlier segments up to the checkpoint it resumed from, not the time lost
        after that checkpoint), and
        ``train/peak_memory_mb`` (:func:`peak_memory_mb`) and ``train/step_memory_mb``, the
        training loop's peak beyond what was in memory when it started (CPU: resident set,
        :func:`memory_since_mb`; CUDA: allocated tensor bytes): the share of the memory that
        the model's steps take, which the process's peak (data, libraries) dilutes."""
        started = getattr(self, "_fit_started", None)
        if started is None:
            return
        cost = {"train/wall_seconds": self.train_wall_seconds(),
                "train/peak_memory_mb": max(peak_memory_mb(self.device),
                                            getattr(self, "_peak_before", 0.0))}
        start = getattr(self, "_memory_start", None)
        step = (memory_since_mb(start) if self.device.type == "cpu" else
                None if start is None else peak_memory_mb(self.device) - start)
        if step is not None:
            cost["train/step_memory_mb"] = step
        for logger in self.loggers:
            logger.log_metrics(cost, step=self.global_step)

    def train_wall_seconds(self) -> float:
        """The training loop's wall time so far, over every segment of a resumed run."""
        started = getattr(self, "_fit_started", None)
        before = getattr(self, "_wall_before", 0.0)
        return before if started is None else before + time.perf_counter() - started

    # -- exact resume: the random streams (and the training time) travel with the checkpoint
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Saves the random states as they are after the last training step: torch's (CPU
        and every CUDA device: dropout), Python's and numpy's; and the training time so far
        (``train_wall_seconds``)."""
        checkpoint["rng_states"] = random_states()
        checkpoint["train_wall_seconds"] = self.train_wall_seconds()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Keeps the saved random states for the first training step of the resumed run:
        restored there, not now, so nothing done before it (the sanity validation, loaders
        created) can move them; and the training time the checkpoint's run took."""
        self._rng_to_restore = checkpoint.get("rng_states")
        self._wall_restored = float(checkpoint.get("train_wall_seconds", 0.0))

    def on_train_batch_start(self, batch, batch_idx) -> None:
        states = getattr(self, "_rng_to_restore", None)
        if states is not None:
            set_random_states(states)
            self._rng_to_restore = None
        if hasattr(self, "_speed"):
            self._speed["start"] = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """Logs ``train/steps_per_second``: optimiser steps per second of training-step time
        (forward, backward, optimiser; data loading, validation and logging excluded) since
        the first ``untimed_steps`` steps (Differentiable Window Table 4 reports it beside
        ``n_parameters``, which :meth:`on_fit_start` logs as a hyper-parameter)."""
        speed = getattr(self, "_speed", None)
        if speed is None or speed["start"] is None:
            return
        speed["steps"] += 1
        if speed["steps"] > 0:
            speed["seconds"] += time.perf_counter() - speed["start"]
            self.log("train/steps_per_second", speed["steps"] / speed["seconds"])

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Stops training with :class:`NonFiniteLossError` when the training loss is NaN or
        infinite, before its backward pass (no optimiser step follows it: the weights stay
        as the last step left them).  Every model's ``training_step`` returns its loss,
        which Lightning's automatic optimisation hands here divided by
        ``accumulate_grad_batches`` (and, with a gradient scaler, scaled): both undone for
        the message.  Under DDP the processes decide together."""
        trainer, step = self.trainer, self.trainer.global_step
        value = float(loss.detach()) * trainer.accumulate_grad_batches
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            value /= float(scaler.get_scale())
        self._stop_unless(math.isfinite(value), value, "training loss")
        self._last_finite_loss = (step, value)

    def stop_if_not_finite(self, x: torch.Tensor, what: str) -> None:
        """Stops training with :class:`NonFiniteLossError` naming ``what`` if ``x`` holds a
        NaN or an infinity: for a quantity a training step needs before its loss exists
        (the latent mixture samples from its routing distribution, which ``torch.
        multinomial`` refuses with a bare error when it is NaN) or that would carry a NaN
        past the step (its moving-average baseline).  The message gives the first
        non-finite value; under DDP the processes decide together."""
        bad = ~torch.isfinite(x.detach())
        finite = not bool(bad.any())
        self._stop_unless(finite, None if finite else float(x.detach()[bad][0]), what)

    def _stop_unless(self, finite: bool, value: float | None, what: str) -> None:
        """Raise :class:`NonFiniteLossError` in every process if any process is not
        ``finite`` (had one stopped alone, the others would fail in the gradient all-reduce
        without the message; measured with gloo: "Connection closed by peer").  A module
        used without a trainer (a training step called by hand) decides alone, at step 0."""
        trainer = self._trainer
        stop = (not finite if trainer is None
                else trainer.strategy.reduce_boolean_decision(not finite, all=False))
        if stop:
            raise NonFiniteLossError(None if finite else value,
                                     0 if trainer is None else trainer.global_step,
                                     self._last_finite_loss, what)

    def lr_factor(self, step: int) -> float:
        """Multiplier of the base learning rate after ``step`` optimiser steps."""
        o = self.optim
        warm = o["warmup_steps"]
        step = step + 1
        if o["schedule"] == "constant":
            return min(1.0, step / warm) if warm else 1.0
        if o["schedule"] == "inverse_sqrt":  # Vaswani et al.'s schedule, peak lr at warm-up end
            return min(step / warm, math.sqrt(warm / step)) if warm else 1 / math.sqrt(step)
        total = o["max_steps"] or (self.trainer.estimated_stepping_batches if self._trainer
                                   else None)
        if not total:
            raise ValueError("schedule 'linear' needs max_steps_for_schedule or a trainer")
        up = min(1.0, step / warm) if warm else 1.0
        return up * max(0.0, 1 - step / total)

    def configure_optimizers(self):
        o = self.optim
        opt = torch.optim.AdamW(self.parameters(), lr=o["lr"], betas=tuple(o["betas"]),
                                weight_decay=o["weight_decay"])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
