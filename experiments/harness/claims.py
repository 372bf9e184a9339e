"""The claims board: which claims of the four papers hold here?

    python -m experiments.claims [--runs DIR] [--out results/CLAIMS.md]

(and beside it results/CLAIMS.png: every claim measured here, our difference with its 95%
interval beside the paper's)
walks every named claim (``Grid.claims``: baseline -> proposal) of every grid of every
experiment script (experiments/*.py with an ``EXPERIMENT``) and writes one row per claim:
the paper, its table, the cells compared, the paper's difference, ours with its 95%
interval and seeds x units, the verdict (holds / not significant / reversed / not run here,
and why), the config it was measured at and a link to its results file (a grid's own
comparisons, without a paper number, counted apart from the papers' claims); below each grid's
table, the paper's setting (the grid's note) and every deviation the configs' own comments
state (``not stated`` where a config has none).

Where the numbers come from, each claim's best evidence (most seeds, then units; a config
other than ``smoke`` before it; recomputed before read):

* recomputed by ``report``'s own paired tests (experiments/harness/report.py
  ``claim_results``, on experiments/harness/significance.py) on the committed run folders
  under results/ (a folder laid out as a runs folder,
  ``<experiment>/<grid>-<config>/<cell>-seed<k>/``, e.g. results/sst_table5_runs) and on
  ``--runs DIR``;
* read from what ``report`` printed into a committed results/*.md whose runs are not
  committed (its claims table, under the ``<experiment> grid <grid>, config <config>`` line).

A verdict from one seed is marked ``(one seed)``: its interval covers the test sample, not the
seed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from experiments.harness.grid_model import (
    DATASET_ARG,
    PROJECT_ROOT,
    Cell,
    Experiment,
    Grid,
    shown_path,
)
from experiments.harness.markdown import CLAIMS_HEADER, table_row
from experiments.harness.runs import configs_with_runs
from experiments.harness.significance import HOLDS, NOT_SIGNIFICANT, REVERSED
from experiments.harness.verdicts import ONE_SEED, ONE_SEED_NOTE, claim_labels, claim_results
from fileio import write_atomic

RESULTS = PROJECT_ROOT / "results"
BOARD = RESULTS / "CLAIMS.md"
#: experiment script prefix -> the paper (docs/papers.md), or what the script compares
PAPERS = {"coda": "CoDA (Tay et al. 2019)",
          "dwin": "Differentiable Window (Nguyen et al. 2020)",
          "decomp": "Decomposable attention (the SNLI write-up; Parikh et al. 2016)",
          "qadm": "Attention density matrix (quantum statistics-inspired attention)",
          # no paper: the suite's own comparison of every mechanism (attention_compare.py)
          "attention": "Which attention? (every mechanism on one recipe; no paper)"}
NOT_RUN = "not run here"
VERDICTS = (HOLDS, NOT_SIGNIFICANT, REVERSED, NOT_RUN)
#: the line of a report that names the grid and config of the table below it
REPORT_LINE = re.compile(r"^(\w+) grid (\S+), config (\S+) \(", re.M)


def experiment_scripts() -> list[Experiment]:
    """Every experiment script's ``EXPERIMENT``, by paper then name."""
    names = sorted(p.stem for p in (PROJECT_ROOT / "experiments").glob("*.py")
                   if "\nEXPERIMENT = Experiment(" in p.read_text())
    names.sort(key=lambda n: list(PAPERS).index(n.split("_")[0]))
    return [importlib.import_module(f"experiments.{n}").EXPERIMENT for n in names]


@dataclass(frozen=True)
class Measured:
    """One metric of a claim as measured: the report's columns as text."""

    label: str
    values: str  # "77.06 -> 76.78"
    diff: str  # "-0.29 [-2.52, +1.95]"
    p: str  # "p=0.777 (bootstrap)"
    verdict: str  # as printed, "(one seed)" included
    seeds: int
    units: int


@dataclass(frozen=True)
class Evidence:
    """A claim's measurements at one config, and where they come from."""

    config: str
    measured: tuple[Measured, ...]
    source: str  # "runs" (recomputed) or "printed"
    where: Path  # the runs folder or the results file

    def rank(self) -> tuple:
        first = self.measured[0]
        return (self.config != "smoke", first.seeds, first.units, self.source == "runs")


@dataclass(frozen=True)
class Untested:
    """Runs or a printed report of a claim's grid at one config without a test of it, and
    why."""

    config: str
    why: str
    source: str
    where: Path


# -- evidence ---------------------------------------------------------------------------------
def run_folders(extra: Path | None = None) -> list[Path]:
    """The committed runs folders under results/ (laid out as $ATTNREPRO_RUNS), and
    ``extra``."""
    names = {e.name for e in experiment_scripts()}
    found = [d for d in sorted(RESULTS.iterdir()) if d.is_dir()
             and any((d / n).is_dir() for n in names)]
    return found + ([extra] if extra else [])


def recomputed(experiment: Experiment, grid: Grid, runs: list[Path]
               ) -> dict[tuple[str, str], list[Evidence | Untested]]:
    """(baseline, proposal) -> the claim's evidence from every runs folder and config with
    runs of ``grid``, by the paired tests ``report`` prints (:func:`claim_results`), or why there is
    none."""
    out: dict[tuple[str, str], list] = {}
    for folder in runs:
        for config in configs_with_runs(experiment, grid, folder):
            root = folder / experiment.name / f"{grid.name}-{config}"
            by_claim: dict[tuple[str, str], list] = {}
            for r in claim_results(experiment, grid, config, root=root):
                by_claim.setdefault((r.baseline, r.proposal), []).append(r)
            for pair, results in by_claim.items():
                tested = [r for r in results if r.comparison is not None]
                out.setdefault(pair, []).append(Evidence(config, tuple(
                    Measured(r.label, f"{r.comparison.row()['baseline']} -> "
                             f"{r.comparison.row()['proposal']}", r.comparison.row()["diff"],
                             f"{r.comparison.row()['p']} ({r.comparison.test})",
                             r.shown_verdict, r.comparison.seeds, r.comparison.units)
                    for r in tested), "runs", folder) if tested
                    else Untested(config, results[0].why, "runs", folder))
    return out


def report_spans(text: str) -> Iterator[tuple[re.Match, int]]:
    """Each report ``report`` printed into a results file's ``text``: the match of its
    ``<experiment> grid <grid>, config <config> (`` line and where the next one starts (or
    the text ends); nothing for a text without such a line."""
    marks = list(REPORT_LINE.finditer(text))
    return zip(marks, [*(m.start() for m in marks[1:]), len(text)])


def printed_tables(path: Path) -> dict[tuple[str, str, str], str]:
    """(experiment, grid, config) -> the report ``report`` printed into a results file: from
    its ``<experiment> grid <grid>, config <config> (`` line to the next such line, the next
    heading or the end of the file."""
    text = path.read_text()
    out = {}
    for mark, end in report_spans(text):
        body = text[mark.start():end]
        heading = re.search(r"^#", body, re.M)
        out[mark.groups()] = body[:heading.start() if heading else len(body)].rstrip()
    return out


def printed_claims(path: Path
                   ) -> dict[tuple[str, str, str], dict[str, list[Measured | str]]]:
    """(experiment, grid, config) -> claim text ("proposal vs baseline") -> the rows of the
    claims tables ``report`` printed into the results file ``path``: their numbers, or the
    report's reason for none."""
    text = path.read_text()
    out: dict = {}
    for mark, end in report_spans(text):
        block = text[mark.end():end]
        if CLAIMS_HEADER not in block:
            continue
        rows = block.split(CLAIMS_HEADER, 1)[1].splitlines()[2:]
        for line in rows:
            if not line.startswith("|"):
                break
            claim, label, _, values, diff, p, verdict, seeds_units = table_row(line)
            key = mark.groups()
            if not diff:  # not run, no paired test: the report's reason
                out.setdefault(key, {}).setdefault(claim, []).append(values)
                continue
            seeds, units = (int(x.replace(",", "")) for x in seeds_units.split(" x "))
            if seeds == 1 and ONE_SEED not in verdict:
                verdict += ONE_SEED  # printed before the report marked it
            out.setdefault(key, {}).setdefault(claim, []).append(
                Measured(label, values, diff, p, verdict, seeds, units))
    return out


def printed(experiment: Experiment, grid: Grid
            ) -> dict[tuple[str, str], list[Evidence | Untested]]:
    """(baseline, proposal) -> the claim's evidence printed into results/*.md, or the
    reports of its grid there that did not test it."""
    out: dict[tuple[str, str], list] = {}
    for path in sorted(RESULTS.glob("*.md")):
        if path.name in ("README.md", BOARD.name):
            continue
        text = path.read_text()
        found = printed_claims(path)
        for m in REPORT_LINE.finditer(text):
            name, grid_name, config = m.groups()
            if (name, grid_name) != (experiment.name, grid.name):
                continue
            claims = found.get(m.groups(), {})
            for baseline, proposal in grid.claims:
                rows = claims.get(f"{proposal} vs {baseline}", [])
                measured = tuple(r for r in rows if isinstance(r, Measured))
                why = next((r for r in rows if isinstance(r, str)),
                           f"{path.name} prints config {config}'s table without it: printed "
                           f"before report tested claims, or its runs' per-example files are "
                           f"not committed")
                out.setdefault((baseline, proposal), []).append(
                    Evidence(config, measured, "printed", path) if measured else
                    Untested(config, why, "printed", path))
    return out


def results_file(evidence: Evidence) -> str:
    """The markdown link to the results file of the evidence (relative to results/): the
    file itself, or the results/*.md that names the committed runs folder (first the one
    whose ``report`` command reads it, ``ATTNREPRO_RUNS=results/<folder>``); a runs folder
    outside results/ as its path."""
    where = evidence.where.resolve()
    if evidence.source == "runs":
        if where.parent != RESULTS.resolve():
            return f"`{shown_path(where)}`"
        texts = {p: p.read_text() for p in RESULTS.glob("*.md") if p.name != BOARD.name}
        named = sorted((p for p, text in texts.items() if f"results/{where.name}" in text),
                       key=lambda p: (f"ATTNREPRO_RUNS=results/{where.name} " not in texts[p],
                                      p.stem != where.name.removesuffix("_runs"),
                                      p.name == "README.md", p.name))  # the folder's own file
        where = named[0] if named else where
    return f"[{where.name}]({where.name})"


# -- settings ---------------------------------------------------------------------------------
def header_comment(path: Path) -> str:
    """The comment block a YAML file opens with, as one paragraph ('' when none)."""
    lines = []
    for line in path.read_text().splitlines() if path.exists() else []:
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(x for x in lines if x)


def datasets(cells: list[Cell]) -> list[str]:
    names: list[str] = []
    for cell in cells:
        for arg in cell.args:
            m = DATASET_ARG.fullmatch(arg)
            if m and m.group(1) not in names:
                names.append(m.group(1))
    return names


def setting(experiment: Experiment, grid: Grid, config: str) -> list[str]:
    """What the config says of its scale and deviations from the paper: its own comment and
    those of the dataset configs the grid's cells merge (``not stated`` where none)."""
    folder = experiment.config_dir
    files = [folder / f"{config}.yaml"] + [folder / config / f"{d}.yaml"
                                           for d in datasets(grid.cells)]
    return [f"`{f.relative_to(PROJECT_ROOT) if f.is_relative_to(PROJECT_ROOT) else f}`"
            + (f" (= `{f.resolve().name}`)" if f.is_symlink() else "")
            + f": {header_comment(f) or 'not stated'}" for f in files if f.exists()]


# -- the board --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    experiment: Experiment
    grid: Grid
    baseline: str
    proposal: str
    paper_diff: str
    evidence: Evidence | Untested | None  # the best evidence, else why not
    verdict: str  # the first metric's, for the counts

    @property
    def paper_claim(self) -> bool:
        """Whether the paper reports a difference for it (else the suite's own comparison:
        a study's setting, the setting it chose, against a cell of the paper)."""
        return not self.paper_diff.startswith("- ")


def paper_diffs(grid: Grid, baseline: str, proposal: str) -> str:
    """The paper's differences on the metrics a claim is tested on; where it gives none
    there, those on the grid's other metrics (a validation figure: no per-example test),
    marked so; ``- (no number for both)`` where it gives none at all (the suite's own
    comparison)."""
    b, p = grid.cell(baseline).paper, grid.cell(proposal).paper
    both = [label for label in grid.metrics if b.get(label) is not None
            and p.get(label) is not None]
    tested = claim_labels(grid)
    diffs = ([f"{label} {p[label] - b[label]:+.2f}" for label in both if label in tested]
             or [f"{label} {p[label] - b[label]:+.2f} (not a test metric: ours is tested on "
                 f"{next(iter(tested), '-')})" for label in both])
    return "<br>".join(diffs) or "- (no number for both)"


def board_rows(runs: Path | None = None) -> list[Row]:
    """One row per named claim of every grid of every experiment script."""
    folders = run_folders(runs)
    rows = []
    for experiment in experiment_scripts():
        for grid in experiment.grids.values():
            if not grid.claims:
                continue
            found = recomputed(experiment, grid, folders)
            for pair, evidence in printed(experiment, grid).items():
                found.setdefault(pair, []).extend(evidence)
            for baseline, proposal in grid.claims:
                candidates = found.get((baseline, proposal), [])
                tested = [e for e in candidates if isinstance(e, Evidence)]
                best = max(tested, key=Evidence.rank, default=None)
                if best is None:  # runs or reports without a test, a real config's first
                    untested = sorted((u for u in candidates if not u.why.startswith("not run")),
                                      key=lambda u: u.config == "smoke")
                    best = untested[0] if untested else None
                    why = "" if best is None else best.why
                    verdict = (f"{NOT_RUN}: no data (the cells were not run)" if best is None
                               else f"{NOT_RUN}: {why}" if why.startswith("no paired test")
                               else f"{NOT_RUN}: no paired test: {why}")
                elif best.config == "smoke":
                    verdict = f"{NOT_RUN}: smoke only"
                else:
                    verdict = best.measured[0].verdict
                rows.append(Row(experiment, grid, baseline, proposal,
                                paper_diffs(grid, baseline, proposal), best, verdict))
    return rows


def verdict_of(row: Row) -> str:
    """The row's verdict among :data:`VERDICTS` (the first metric's; 'one seed' counted with
    its verdict)."""
    if row.verdict.startswith(NOT_RUN):
        return NOT_RUN
    return row.verdict.replace(ONE_SEED, "")


def paper_of(experiment: Experiment) -> str:
    return PAPERS[experiment.name.split("_")[0]]


def format_row(row: Row) -> str:
    e = row.evidence
    claim = f"| {row.proposal} vs {row.baseline} | `{row.baseline}` -> `{row.proposal}` " \
            f"| {row.paper_diff} |"
    at = "-" if e is None else f"config {e.config}"
    link = "-" if e is None else results_file(e)
    if not isinstance(e, Evidence) or e.config == "smoke":
        return f"{claim} - | - | {row.verdict} | {at} | {link} |"
    ours = "<br>".join(f"{m.label}: {m.values}, {m.diff}, {m.p}" for m in e.measured)
    seeds = "<br>".join(f"{m.seeds} x {m.units:,}" for m in e.measured)
    verdicts = "<br>".join(m.verdict for m in e.measured)
    return f"{claim} {ours} | {seeds} | {verdicts} | {at} | {link} |"


def summary(rows: list[Row], what: str, total: str) -> list[str]:
    """The counts of ``rows`` per paper and verdict, a last line ``total`` over them all."""
    counts = Counter((paper_of(r.experiment), verdict_of(r)) for r in rows)
    lines = [f"| paper | {what} | " + " | ".join(VERDICTS) + " |",
             "|---|---|" + "---|" * len(VERDICTS)]
    for paper in [*dict.fromkeys(paper_of(r.experiment) for r in rows), total]:
        n = [sum(c for (p, v), c in counts.items() if v == verdict and paper in (p, total))
             for verdict in VERDICTS]
        lines.append(f"| {paper} | {sum(n)} | " + " | ".join(map(str, n)) + " |")
    return lines


def paper_and_own(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    """``rows`` split into the papers' claims and the grids' own comparisons, in order."""
    return [r for r in rows if r.paper_claim], [r for r in rows if not r.paper_claim]


#: the last line of the board's second summary (the suite's own comparisons)
OWN_TOTAL = "all, the suite's own"


def format_board(rows: list[Row], figure: Path, runs: Path | None = None) -> str:
    """The board's markdown; ``figure``: the file of :func:`board_figure`, beside it."""
    papers = list(dict.fromkeys(paper_of(r.experiment) for r in rows))
    claims, own = paper_and_own(rows)
    lines = ["# Claims board: which claims of the four papers hold here?", "",
             "Every gain a paper claims that a grid of this suite names (`Grid.claims`: "
             "baseline -> proposal), one row each: the paper's difference, ours with its 95% "
             "interval (paired over seeds and test examples, 10,000 replicates: "
             "experiments/harness/significance.py through `report`), the verdict at alpha 0.05 and "
             "the config it was measured at. 'holds': significant in the paper's direction; "
             "'not significant': the interval holds 0; 'reversed': significant the other way; "
             f"'{NOT_RUN}': no data (no runs of both cells), smoke only (only the smoke "
             f"config ran: a check that it runs, not a measurement), or no paired test. "
             f"{ONE_SEED_NOTE} Where a claim has several metrics, each is on its own line; "
             "the counts use the first (the paper's first column). A grid also names "
             "comparisons of its own, with no paper number for one of the two cells (a "
             "study's settings against the paper's default, the setting it chose against "
             "the paper's cells): they are on the board (paper diff '- (no number for "
             "both)'; 'holds' there reads 'the proposal is better') and counted apart, never "
             "among the paper's claims.", "",
             "Sources: report's paired tests recomputed on the committed runs folders under "
             "results/" + (f" and `{shown_path(runs)}`" if runs else "") + ", else the "
             "claims tables `report` printed into a committed results file whose runs are "
             "not committed; per claim the evidence with the most seeds, then test units.",
             "", "## Summary", "", "The papers' claims (a difference the paper reports):",
             "", *summary(claims, "claims", "all")]
    if own:
        lines += ["", "The suite's own comparisons (no paper number for one of the two "
                  "cells):", "", *summary(own, "comparisons", OWN_TOTAL)]
    lines += ["", f"![The claims measured here: ours with its 95% interval beside the "
                  f"paper's difference]({figure.name})"]
    for paper in papers:
        lines += ["", f"## {paper}"]
        for grid_rows in _by_grid([r for r in rows if paper_of(r.experiment) == paper]):
            e, g = grid_rows[0].experiment, grid_rows[0].grid
            lines += ["", f"### {g.title.split(':')[0]}: {e.name} grid {g.name}", "",
                      "| claim | cells compared | paper diff | ours: baseline -> proposal, "
                      "diff [95% CI], p | seeds x units | verdict | measured at | results |",
                      "|---|---|---|---|---|---|---|---|"]
            lines += [format_row(r) for r in grid_rows]
            lines += ["", f"Paper's setting and ours (the grid's note): {g.note or 'not stated'}"]
            for config in dict.fromkeys(r.evidence.config for r in grid_rows
                                        if r.evidence is not None):
                lines += ["", f"Scale and deviations of config {config}:", ""]
                lines += [f"- {s}" for s in setting(e, g, config)] or ["- not stated"]
    return "\n".join(lines)


#: a difference with its interval as the report prints it: "+0.23 [-2.52, +2.64]"
INTERVAL = re.compile(r"([+-]\d+\.\d+) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\]")


def board_figure(rows: list[Row]):
    """Every claim measured here (not smoke) as a row of experiments/harness/plots.py's claims
    figure: our difference with its 95% interval beside the paper's."""
    from experiments.harness.plots import ClaimBar, plot_claim_bars

    bars = []
    measured = [r for r in rows if isinstance(r.evidence, Evidence)
                and r.evidence.config != "smoke"]
    for row in measured:
        e = row.evidence
        b, p = row.grid.cell(row.baseline).paper, row.grid.cell(row.proposal).paper
        for m in e.measured:
            paper = (p[m.label] - b[m.label] if b.get(m.label) is not None
                     and p.get(m.label) is not None else None)
            diff, low, high = (float(x) for x in INTERVAL.fullmatch(m.diff).groups())
            bars.append(ClaimBar(f"{row.grid.title.split(':')[0]}: {row.proposal} vs "
                                 f"{row.baseline} ({m.label}, config {e.config}): "
                                 f"{m.verdict}, {m.seeds} x {m.units:,}", paper,
                                 (diff, low, high)))
    return plot_claim_bars(bars, f"The claims measured here: {len(measured)} of {len(rows)} "
                                 "named claims (the others: not run here)")


def _by_grid(rows: list[Row]) -> list[list[Row]]:
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.experiment.name, r.grid.name), []).append(r)
    return list(groups.values())


def provenance(runs: Path | None) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=PROJECT_ROOT,
                            capture_output=True, text=True).stdout.strip() or "not recorded"
    command = "python -m experiments.claims" + (f" --runs {shown_path(runs)}" if runs else "")
    return "\n".join([
        "", "## Provenance", "",
        f"- Commit: written at {commit} (each results file names the commits of its runs).",
        f"- Command: `{command}` (reads results/ and the experiment scripts; trains nothing).",
        f"- Machine: any: the board recomputes paired tests on committed files (this one: "
        f"{os.cpu_count()} cores); the runs' machines are in their results files.",
        "- Threads: 1 process (numpy's paired bootstrap, seeded: the same numbers on any "
        "machine).",
        "- Rerun: re-derived by tests/experiments/test_claims.py::test_committed_board_is_what_the_"
        "command_writes (every table row), about a minute."])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.claims",
                                description="write the claims board (results/CLAIMS.md)")
    p.add_argument("--runs", type=Path, default=None,
                   help="a runs folder ($ATTNREPRO_RUNS layout) read beside results/")
    p.add_argument("--out", type=Path, default=BOARD, help="default: results/CLAIMS.md")
    args = p.parse_args(argv)
    rows = board_rows(args.runs)
    figure = args.out.with_suffix(".png")
    text = format_board(rows, figure, args.runs) + "\n" + provenance(args.runs) + "\n"
    write_atomic(args.out, text)
    from experiments.harness.plots import save_figure

    save_figure(board_figure(rows), figure)
    said = []
    for what, kept in zip(("claims of the papers", "comparisons of the suite's own"),
                          paper_and_own(rows)):
        counts = Counter(verdict_of(r) for r in kept)
        said.append(f"{len(kept)} {what} ("
                    + ", ".join(f"{v} {counts[v]}" for v in VERDICTS) + ")")
    print(f"{shown_path(args.out)}: " + "; ".join(said))

