"""Checkpoint averaging: the weights of the last N checkpoints of a run, averaged element-wise
(one implementation for every model of the suite).

Both translation papers test an average of checkpoints rather than the last weights: CoDA
Table 4 (IWSLT'15 En-Vi, Sec. 3.4: tensor2tensor's "default checkpoint averaging script",
``avg_checkpoints``) and Differentiable Window Table 1 ("we averaged the last 5
checkpoints"; the authors' code is built on fairseq, whose
``scripts/average_checkpoints.py`` does it).  Both load the last N checkpoints of a run
and replace every parameter by its mean over them.  Here:

* floating-point tensors are averaged (summed in float64, divided by N, cast back to their
  dtype, so the mean is rounded once);
* integer and bool tensors (step counters, index buffers, masks) are taken from the last
  checkpoint, unchanged: a mean of counters is not a counter, and it is the last
  checkpoint whose ``global_step``, epoch and hyper-parameters the average carries;
* keys, shapes and dtypes must agree across the checkpoints, or the error names the files.

A Lightning checkpoint is named ``epoch=E-step=S.ckpt`` by ``ModelCheckpoint``; "the last
N" are the N with the largest S (not the newest files, not the last in name order: step=100
sorts before step=20).  ``last.ckpt`` (a copy of one of them) is ignored.

    python -m lit_models.averaging runs/coda_mlu/adhoc/<run> --last 5
    python -m lit_models.averaging a.ckpt b.ckpt --out averaged.ckpt

The runner's ``--run.average_last N`` averages the last N checkpoints after ``fit`` and
tests on the average (experiments/harness/runner.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from fileio import checkpoint_step, write_atomic

#: a run's checkpoint folder: runs/<experiment>/<group>/<name>/checkpoints
CHECKPOINTS = "checkpoints"


def averaged_name(n: int) -> str:
    """The file name of the average of the last ``n`` checkpoints, beside them."""
    return f"averaged-last{n}.ckpt"


def average_state_dicts(state_dicts: Iterable[dict], names: Sequence[str] | None = None
                        ) -> dict:
    """The element-wise mean of every floating-point tensor of ``state_dicts``; integer and
    bool tensors (and any non-tensor value) from the last one.  ``names`` (one per state
    dict, e.g. the files) label the errors.  The state dicts are read one after the other, so
    an iterator that loads each checkpoint only when asked holds two models in memory, not N.
    """
    sums: dict[str, Tensor | None] = {}
    first: dict | None = None
    last: dict = {}
    n = 0
    for i, state in enumerate(state_dicts):
        name = names[i] if names is not None else f"state dict {i}"
        if first is None:
            first, first_name = state, name
            sums = {k: _accumulator(v) for k, v in state.items()}
        else:
            _check_same(first, first_name, state, name)
            for k, v in state.items():
                if sums[k] is not None:
                    sums[k] += v
        last, n = state, n + 1
    if first is None:
        raise ValueError("no state dicts to average")
    return {k: last[k] if s is None else (s / n).to(last[k].dtype) for k, s in sums.items()}


def _accumulator(value) -> Tensor | None:
    """A float64 (complex128) copy of a floating-point tensor to sum into; None otherwise."""
    if isinstance(value, Tensor) and (value.is_floating_point() or value.is_complex()):
        return value.detach().to(torch.complex128 if value.is_complex() else torch.float64,
                                 copy=True)
    return None


def _check_same(first: dict, first_name: str, state: dict, name: str) -> None:
    missing, extra = sorted(set(first) - set(state)), sorted(set(state) - set(first))
    if missing or extra:
        raise ValueError(f"cannot average {first_name} and {name}: their keys differ "
                         f"(only in {first_name}: {_few(missing)}; only in {name}: {_few(extra)})")
    for k, a in first.items():
        b = state[k]
        if isinstance(a, Tensor) != isinstance(b, Tensor):
            raise ValueError(f"cannot average {first_name} and {name}: {k!r} is a tensor in one "
                             "and not in the other")
        if isinstance(a, Tensor) and (a.shape != b.shape or a.dtype != b.dtype):
            raise ValueError(f"cannot average {first_name} and {name}: {k!r} is "
                             f"{tuple(a.shape)} {a.dtype} in the first and {tuple(b.shape)} "
                             f"{b.dtype} in the second")


def _few(keys: list[str], at_most: int = 5) -> str:
    if not keys:
        return "none"
    more = f" and {len(keys) - at_most} more" if len(keys) > at_most else ""
    return ", ".join(keys[:at_most]) + more


def checkpoint_folder(directory: str | Path) -> Path:
    """A run's checkpoint folder: ``directory`` itself or its ``checkpoints/``."""
    directory = Path(directory)
    if (directory / CHECKPOINTS).is_dir():
        return directory / CHECKPOINTS
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint folder {directory}")
    return directory


def last_checkpoints(directory: str | Path, n: int) -> list[Path]:
    """The ``n`` checkpoints of the largest training steps in ``directory`` (a run's
    ``checkpoints/`` folder, or the run folder holding it), oldest first, by the step in
    their ``epoch=E-step=S.ckpt`` names."""
    if n < 1:
        raise ValueError(f"cannot average the last {n} checkpoints: n must be at least 1")
    folder = checkpoint_folder(directory)
    files = sorted(folder.glob("*.ckpt"))
    by_step: dict[int, list[Path]] = {}
    for path in files:
        step = checkpoint_step(path)
        if step is not None:
            by_step.setdefault(step, []).append(path)
    if len(by_step) < n:
        found = ", ".join(p.name for p in files) or "no .ckpt files"
        raise FileNotFoundError(
            f"cannot average the last {n} checkpoints of {folder}: it holds {len(by_step)} "
            f"checkpoint(s) named epoch=E-step=S.ckpt (found: {found}); keep every checkpoint "
            "(ModelCheckpoint save_top_k: -1) and save at least that many")
    steps = sorted(by_step)[-n:]
    twice = {s: by_step[s] for s in steps if len(by_step[s]) > 1}
    if twice:
        step, paths = next(iter(twice.items()))
        raise ValueError(f"{folder} holds {len(paths)} checkpoints of step {step} "
                         f"({', '.join(p.name for p in paths)}), from two runs in one folder; "
                         "remove the stale ones or pass the files to average")
    return [by_step[s][0] for s in steps]


def load_checkpoint(path: str | Path) -> dict:
    """A Lightning checkpoint on the CPU.  A run's own file: its hyper-parameters hold objects
    (the attention flags) that torch's weights-only loader refuses."""
    return torch.load(path, map_location="cpu", weights_only=False)


def average_checkpoints(paths: Sequence[str | Path], out: str | Path | None = None) -> dict:
    """A Lightning checkpoint whose ``state_dict`` is the average of ``paths``'s (see
    :func:`average_state_dicts`) and whose other entries (hyper_parameters, epoch,
    global_step, loops, callbacks) are the last path's, so ``Model.load_from_checkpoint``
    and ``trainer.test(ckpt_path=...)`` read it like any checkpoint.  The optimiser and
    scheduler states are dropped: they belong to the last weights, not to their average
    (so training cannot silently resume from it).  ``averaged_checkpoints`` lists the
    files.  Written to ``out`` when given."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("no checkpoints to average")
    kept: dict = {}

    def state_dicts():
        for path in paths:
            checkpoint = load_checkpoint(path)
            if "state_dict" not in checkpoint:
                raise ValueError(f"{path} is not a Lightning checkpoint: it has no state_dict "
                                 f"(keys: {', '.join(map(str, checkpoint))})")
            kept.clear()
            kept.update(checkpoint)
            yield checkpoint["state_dict"]

    averaged = average_state_dicts(state_dicts(), names=[str(p) for p in paths])
    checkpoint = {k: v for k, v in kept.items() if k not in ("optimizer_states",
                                                             "lr_schedulers")}
    checkpoint["state_dict"] = averaged
    checkpoint["averaged_checkpoints"] = [str(p) for p in paths]
    if out is not None:
        write_atomic(out, lambda tmp: torch.save(checkpoint, tmp))
    return checkpoint


def average_last(directory: str | Path, n: int, out: str | Path | None = None
                 ) -> tuple[list[Path], Path]:
    """Average the last ``n`` checkpoints of a run's checkpoint folder and write the average
    to ``out`` (default: ``averaged-last<n>.ckpt`` beside them).  Returns (the averaged
    files, the written file)."""
    paths = last_checkpoints(directory, n)
    out = Path(out) if out is not None else paths[-1].parent / averaged_name(n)
    average_checkpoints(paths, out)
    return paths, out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m lit_models.averaging",
        description="Average the weights of Lightning checkpoints: the last N of a run "
                    "(a run folder or its checkpoints/ folder) or the .ckpt files given.")
    p.add_argument("inputs", nargs="+", help="a run or checkpoint folder, or .ckpt files")
    p.add_argument("--last", type=int, default=None,
                   help="average the last N checkpoints of the folder, by training step")
    p.add_argument("--out", default=None,
                   help="output file (default for a folder: averaged-last<N>.ckpt in it)")
    args = p.parse_args(argv)
    try:
        if len(args.inputs) == 1 and Path(args.inputs[0]).is_dir():
            if args.last is None:
                p.error("a folder needs --last N")
            paths, out = average_last(args.inputs[0], args.last, args.out)
        else:
            if args.last is not None:
                p.error("--last N applies to a folder, not to a list of files")
            if args.out is None:
                p.error("averaging a list of files needs --out")
            paths, out = [Path(a) for a in args.inputs], Path(args.out)
            missing = [str(a) for a in paths if not a.is_file()]
            if missing:
                raise FileNotFoundError(f"no such checkpoint: {', '.join(missing)}")
            average_checkpoints(paths, out)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(f"averaged {len(paths)} checkpoints: " + ", ".join(map(str, paths)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
