"""``keep``: copy a grid's finished runs into a folder to commit (``results/<name>_runs``),
so that ``report``, the slices and the claims board come out again from the commit.

Each finished run (its CSV holds every metric of the grid) gives ``metrics.csv``,
``config.yaml``, ``hparams.yaml`` and its per-example files (``predictions-test*.jsonl``,
``hypotheses-test*.jsonl``, ``bleu-*.json``); checkpoints, W&B files and logs stay behind.
A row's ``input`` (the classifier's and the language model's input text, a whole review
for IMDb) is left out; its ``tokens`` (the number of tokens the model read, which the
input-length slices need) stays.  Every other field stays: the slices and the tests read
them (MLU problems, NLI pairs, translation sources).

Runs written before the models wrote ``tokens`` have the text without them, and runs
committed before ``keep`` have neither.  ``--tokens-from-data`` gives them their counts from
the run's own test set: its DataModule, built from the run's ``config.yaml``, batched as the
test batched it (the same tokenizer, truncation and ``index``), each example's count (the
batch mask's sum) by its id.  A row that has ``tokens`` must agree with it (so a tokenizer
trained again elsewhere is checked against the run's); one that disagrees, or whose id is
not in the test set, stops the command, naming the file and the line.

``--to`` may be the runs folder itself (``ATTNREPRO_RUNS=results/x_runs ... keep
--to results/x_runs``): then the per-example files are rewritten in place.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import yaml

from experiments.harness.command_line import add_config_arguments, chosen_config, command_parser
from experiments.harness.grid_model import Experiment, cell_runs, group_name, shown_path
from experiments.harness.runs import finishing_metrics, run_finished

#: the files of a finished run that a commit keeps, beside its per-example files
RUN_FILES = ("metrics.csv", "config.yaml", "hparams.yaml")
#: the per-example files of a run's tests
EXAMPLE_FILES = ("predictions-test*.jsonl", "hypotheses-test*.jsonl", "bleu-*.json")


def keep_parser(experiment: Experiment) -> argparse.ArgumentParser:
    p = command_parser(experiment, "keep", cells=True)
    p.add_argument("grid", help=f"one of: {', '.join(experiment.grids)} (below)")
    add_config_arguments(p, experiment)
    p.add_argument("--to", required=True, type=Path, metavar="DIR",
                   help="the folder to commit (e.g. results/<name>_runs): the runs go to "
                        "DIR/<experiment>/<grid>-<config>/<cell>-seed<k>/")
    p.add_argument("--cells", nargs="*", default=None,
                   help="only these cells (default: every cell, below)")
    p.add_argument("--tokens-from-data", action="store_true",
                   help="take each example's number of tokens from the run's test set (its "
                        "DataModule, built from its config.yaml): rows without 'tokens' get "
                        "it, rows with them must agree")
    p.add_argument("--force", action="store_true",
                   help="keep every run again (default: pass over a kept run with the same "
                        "metrics.csv, refuse one whose metrics.csv differs, naming it)")
    return p


def keep_runs(experiment: Experiment, argv: list[str]) -> None:
    """The ``keep`` command: one line per run (kept, already kept, not finished)."""
    args = keep_parser(experiment).parse_args(argv)
    grid = experiment.grid(args.grid)
    config = chosen_config(experiment, args)
    prog = f"{experiment.name}.py keep"
    cells = [grid.cell(n) for n in dict.fromkeys(args.cells)] if args.cells else grid.cells
    source = experiment.grid_folder(grid, config)
    target = args.to / experiment.name / group_name(grid, config)
    in_place = target.resolve() == source.resolve()
    runs = [(cell, run) for cell in cells for run in cell_runs(source, cell)]
    if not runs:
        raise SystemExit(f"{prog}: no run of {', '.join(c.name for c in cells)} in "
                         f"{shown_path(source)}")
    counts = TokenCounts(prog) if args.tokens_from_data else None
    refused = []
    for cell, run in runs:
        if not run_finished(run, grid, cell):
            print(f"  {run.name}: not finished (its CSV lacks "
                  f"{', '.join(finishing_metrics(grid, cell).values())}): not kept", flush=True)
            continue
        out = target / run.name
        if not in_place and not args.force and (out / "metrics.csv").exists():
            if (out / "metrics.csv").read_bytes() == (run / "metrics.csv").read_bytes():
                print(f"  {run.name}: kept before (the same metrics.csv in {shown_path(out)})",
                      flush=True)
                continue
            refused.append(run.name)
            continue
        changed = keep_run(run, out, counts, in_place)
        what = f"{changed} per-example file(s) rewritten" if in_place else "kept"
        print(f"  {run.name}: {what} -> {shown_path(out)}", flush=True)
    if refused:
        raise SystemExit(f"{prog}: {len(refused)} run(s) kept before differ from the runs in "
                         f"{shown_path(source)}: {', '.join(refused)}; --force replaces them")


def keep_run(run: Path, out: Path, counts: TokenCounts | None, in_place: bool = False) -> int:
    """Copy one finished run's files into ``out`` (or, ``in_place``, rewrite its per-example
    files where they are); the number of per-example files written.  Every file is read and
    checked before anything is written: a run that stops the command leaves nothing half
    kept."""
    rewritten: dict[str, str] = {}
    copied: list[Path] = [run / name for name in RUN_FILES if (run / name).exists()]
    for pattern in EXAMPLE_FILES:
        for path in sorted(run.glob(pattern)):
            if path.suffix != ".jsonl":
                copied.append(path)
                continue
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n"
                           for r in kept_rows(path, counts))
            if not in_place or path.read_text(encoding="utf-8") != text:
                rewritten[path.name] = text
    if not in_place:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for path in copied:
            shutil.copy2(path, out / path.name)
    for name, text in rewritten.items():
        (out / name).write_text(text, encoding="utf-8")
    return len(rewritten)


def kept_rows(path: Path, counts: TokenCounts | None) -> list[dict]:
    """The rows of a per-example file as kept: ``input`` left out, ``tokens`` kept.  With
    ``counts``, a row without ``tokens`` (written before the model wrote them, with or
    without its text) gets the test set's count of its id, and a row with them must agree
    with it; without ``counts``, a row with ``input`` but no ``tokens`` stops the command
    (its text, the decoded words, does not give the model's token count)."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    from_data = counts.of(path.parent) if counts is not None and rows else {}
    out = []
    for line, row in enumerate(rows, 1):
        row = dict(row)
        text = row.pop("input", None)
        if from_data:
            if row.get("id") not in from_data:
                raise SystemExit(f"{shown_path(path)}, line {line}: id {row.get('id')!r} is not "
                                 f"in the run's test set ({len(from_data)} examples)")
            n = from_data[row["id"]]
            if "tokens" in row and row["tokens"] != n:
                raise SystemExit(f"{shown_path(path)}, line {line}: 'tokens' is {row['tokens']} "
                                 f"but the run's test set gives id {row['id']} {n} tokens (its "
                                 "data or tokenizer is not the run's)")
            row = _with_tokens(row, n)
        elif text is not None and "tokens" not in row:
            raise SystemExit(f"{shown_path(path)}, line {line}: an input without 'tokens' (written "
                             "before the model counted them): --tokens-from-data takes the "
                             "counts from the run's test set")
        out.append(row)
    return out


def _with_tokens(row: dict, n: int) -> dict:
    """``row`` with ``tokens`` after its ``id`` (where the model writes it)."""
    keys = list(row)
    at = keys.index("id") + 1 if "id" in keys else 0
    keys.insert(at, "tokens")
    return {k: (n if k == "tokens" else row[k]) for k in keys}


class TokenCounts:
    """Each test example's number of input tokens, by id, from a run's DataModule (built
    from the run's ``config.yaml``), once per distinct data section: the runs of a grid
    share it."""

    def __init__(self, prog: str):
        self.prog = prog
        self._built: dict[str, dict[int, int]] = {}

    def of(self, run: Path) -> dict[int, int]:
        config_path = run / "config.yaml"
        data = (yaml.safe_load(config_path.read_text()) or {}).get("data")
        if not isinstance(data, dict) or "class_path" not in data:
            raise SystemExit(f"{self.prog}: {shown_path(config_path)} has no data.class_path: "
                             "the run's DataModule cannot be built")
        key = json.dumps(data, sort_keys=True)
        if key not in self._built:
            start = time.time()
            print(f"  {run.name}: the test set's token counts from {data['class_path']} "
                  f"(its config.yaml) ...", flush=True)
            self._built[key] = test_token_counts(data, config_path)
            print(f"  {run.name}: {len(self._built[key])} test examples counted in "
                  f"{time.time() - start:.0f} s", flush=True)
        return self._built[key]


def test_token_counts(data: dict, where: Path) -> dict[int, int]:
    """id -> number of input tokens (the batch mask's sum) of every example of the test
    dataloader of the DataModule ``data`` (``class_path`` and ``init_args``)."""
    from experiments.harness.grid_model import import_class

    cls = import_class(data["class_path"])
    module = cls(**(data.get("init_args") or {}))
    module.prepare_data()
    module.setup("test")
    loader = module.test_dataloader()
    if isinstance(loader, (list, tuple, dict)):
        raise SystemExit(f"{shown_path(where)}: {data['class_path']} has several test "
                         "dataloaders; --tokens-from-data counts a single one")
    counts: dict[int, int] = {}
    for batch in loader:
        if not isinstance(batch, dict) or "index" not in batch or "mask" not in batch:
            raise SystemExit(f"{shown_path(where)}: {data['class_path']}'s test batches have "
                             "no 'index' and 'mask': no token counts to take from them")
        counts.update(zip(batch["index"].tolist(), batch["mask"].sum(1).tolist()))
    return counts
