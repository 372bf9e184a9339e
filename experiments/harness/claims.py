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
from experiments.harness.markdown import CLAIMS_HEADER_START, table_row
from experiments.harness.not_run import why_not_run
from experiments.harness.runs import configs_with_runs
from experiments.harness.scale import Scale, grid_scales
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
#: runs of the claim's cells exist (a results file prints them) but no paired test of them
NO_TEST = "measured, no paired test"
VERDICTS = (HOLDS, NOT_SIGNIFICANT, REVERSED, NO_TEST, NOT_RUN)
#: the line of a report that names the grid and config of the table below it
REPORT_LINE = re.compile(r"^(\w+) grid (\S+), config (\S+) \(", re.M)
#: a grid command a results file shows (its table printed without report's grid line)
GRID_COMMAND = re.compile(r"experiments/(\w+)\.py grid (\S+) (?:.* )?--config (\w+)")


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
    """A claim's measurements at one config of one grid, and where they come from."""

    config: str
    measured: tuple[Measured, ...]
    source: str  # "runs" (recomputed) or "printed"
    where: Path  # the runs folder or the results file
    scale: Scale  # of the claim's cells at the config (experiments/harness/scale.py)
    grid: str = ""  # "<experiment> <grid>": where the claim was measured

    def rank(self) -> tuple:
        """Most faithful first when sorted descending: a measurement (not smoke, the real
        data), the share of the paper config's budget, its model and batch, then seeds and
        test units."""
        first = self.measured[0]
        return (*self.scale.rank(), first.seeds, first.units, self.source == "runs")

    def at(self) -> str:
        """Where and at what scale it was measured, as the board says it."""
        first = self.measured[0]
        return (f"{self.grid}, config {self.config} ({self.scale.short()}; "
                f"{first.seeds} x {first.units:,}): {first.verdict}")


@dataclass(frozen=True)
class Untested:
    """Runs or a printed report of a claim's grid at one config without a test of it, and
    why."""

    config: str
    why: str
    source: str
    where: Path
    scale: Scale
    grid: str = ""


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
    at = f"{experiment.name} {grid.name}"
    for folder in runs:
        for config in configs_with_runs(experiment, grid, folder):
            root = folder / experiment.name / f"{grid.name}-{config}"
            scales = grid_scales(experiment, grid, config)
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
                    for r in tested), "runs", folder, scales[pair[0]], at) if tested
                    else Untested(config, results[0].why, "runs", folder, scales[pair[0]], at))
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
        if CLAIMS_HEADER_START not in block:
            continue
        rows = block.split(CLAIMS_HEADER_START, 1)[1].splitlines()[2:]
        for line in rows:
            if not line.startswith("|"):
                break
            # (a report printed before the scale column has eight cells)
            claim, label, _, values, diff, p, verdict, seeds_units = table_row(line)[:8]
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
    reports of its grid there that did not test it (a table printed without its claims, or
    a file that shows the grid's command and its table without report's grid line).  A
    claim printed from a smoke config or synthetic data gets no verdict, whatever the file
    says."""
    out: dict[tuple[str, str], list] = {}
    at = f"{experiment.name} {grid.name}"
    for path in sorted(RESULTS.glob("*.md")):
        if path.name in ("README.md", BOARD.name):
            continue
        text = path.read_text()
        found = printed_claims(path)
        reports = {m.group(3) for m in REPORT_LINE.finditer(text)
                   if m.groups()[:2] == (experiment.name, grid.name)}
        # a file with the grid's command and a table of its own, no report of the grid
        commands = {} if reports else ran_cells(text, experiment, grid)
        for config in sorted(reports | set(commands)):
            if config not in experiment.configs():
                continue
            scales = grid_scales(experiment, grid, config)
            claims = found.get((experiment.name, grid.name, config), {})
            for baseline, proposal in grid.claims:
                rows = claims.get(f"{proposal} vs {baseline}", [])
                scale = scales[baseline]
                measured = tuple(r if scale.measurement else
                                 Measured(r.label, r.values, r.diff, r.p, scale.no_verdict(),
                                          r.seeds, r.units)
                                 for r in rows if isinstance(r, Measured))
                why = next((r for r in rows if isinstance(r, str)), None)
                if why is None and not measured:
                    if not all(_has_numbers(text, cell) and cell in commands.get(config, {cell})
                               for cell in (baseline, proposal)):
                        continue  # its table does not hold both cells
                    why = (f"{path.name} prints config {config}'s table without it: printed "
                           f"before report tested claims, or its runs' per-example files are "
                           f"not committed")
                out.setdefault((baseline, proposal), []).append(
                    Evidence(config, measured, "printed", path, scale, at) if measured else
                    Untested(config, why, "printed", path, scale, at))
    return out


def ran_cells(text: str, experiment: Experiment, grid: Grid) -> dict[str, set[str]]:
    """config -> the cells of ``grid`` the grid commands shown in ``text`` ran (every cell
    of a command without ``--cells``)."""
    out: dict[str, set[str]] = {}
    for m in GRID_COMMAND.finditer(text):
        if m.groups()[:2] != (experiment.name, grid.name):
            continue
        line = text[m.start():text.find("\n", m.start())]
        named = re.search(r"--cells ((?:[\w.-]+ ?)+)", line)
        cells = set(named.group(1).split()) if named else {c.name for c in grid.cells}
        out.setdefault(m.group(3), set()).update(cells)
    return out


def _has_numbers(text: str, cell: str) -> bool:
    """Whether a table row of ``text`` is the cell's, with a number in it (not 'not run')."""
    return any(re.search(r"\d", " ".join(table_row(line)[1:])) and "not run" not in line
               for line in re.findall(rf"^\| {re.escape(cell)} \|.*$", text, re.M))


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
                       key=lambda p: (not reports_from(texts[p], where.name),
                                      f"ATTNREPRO_RUNS=results/{where.name} " not in texts[p],
                                      p.stem != where.name.removesuffix("_runs"),
                                      p.name == "README.md", p.name))  # the folder's own file
        where = named[0] if named else where
    return f"[{where.name}]({where.name})"


def reports_from(text: str, folder: str) -> bool:
    """Whether ``text`` shows a ``report`` command that reads the runs folder ``folder`` as
    its own (``ATTNREPRO_RUNS=results/<folder> python ... report ...``), not only as the other
    side of ``--against``."""
    return any("--against" not in line for line in re.findall(
        rf"ATTNREPRO_RUNS=results/{re.escape(folder)} python \S+ report[^\n]*", text))


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
    """A claim on the board: a paper's claim once (wherever grids name it), a grid's own
    comparison once per grid."""

    experiment: Experiment
    grid: Grid
    baseline: str
    proposal: str
    paper_diff: str
    evidence: Evidence | Untested | None  # the most faithful measurement, else why not
    verdict: str  # the first metric's, for the counts
    also: tuple[Evidence, ...] = ()  # the claim's other measurements, most faithful first

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


def claim_key(experiment: Experiment, grid: Grid, baseline: str, proposal: str) -> tuple:
    """What makes two grids' claims one claim of a paper: the paper and the numbers it gives
    both cells (a grid that reruns a table at another scale names the same cells with the
    same numbers); a comparison without paper numbers is its grid's own."""
    b, p = grid.cell(baseline).paper, grid.cell(proposal).paper
    numbers = tuple((label, b[label], p[label]) for label in grid.metrics
                    if b.get(label) is not None and p.get(label) is not None)
    if not numbers:
        return (experiment.name, grid.name, baseline, proposal)
    return (paper_of(experiment), numbers)


def board_rows(runs: Path | None = None) -> list[Row]:
    """One row per claim of a paper (its most faithful measurement over every grid that
    names it, never a smoke run or synthetic data; the others as ``also``) and per own
    comparison of a grid, in the order the grids first name them."""
    folders = run_folders(runs)
    named: dict[tuple, list[tuple[Experiment, Grid, str, str]]] = {}
    found: dict[tuple, list[Evidence | Untested]] = {}
    for experiment in experiment_scripts():
        for grid in experiment.grids.values():
            if not grid.claims:
                continue
            evidence = recomputed(experiment, grid, folders)
            for pair, printed_evidence in printed(experiment, grid).items():
                evidence.setdefault(pair, []).extend(printed_evidence)
            for baseline, proposal in grid.claims:
                key = claim_key(experiment, grid, baseline, proposal)
                named.setdefault(key, []).append((experiment, grid, baseline, proposal))
                found.setdefault(key, []).extend(evidence.get((baseline, proposal), []))
    rows = []
    for key, names in named.items():
        experiment, grid, baseline, proposal = names[0]
        candidates = found[key]
        measured, seen = [], set()  # one per grid and config: the runs' or else the printed
        for e in sorted((e for e in candidates if isinstance(e, Evidence)
                         and e.scale.measurement), key=Evidence.rank, reverse=True):
            if (e.grid, e.config) not in seen:
                seen.add((e.grid, e.config))
                measured.append(e)
        if measured:
            best, also = measured[0], tuple(measured[1:])
            verdict = best.measured[0].verdict
        else:
            also = ()
            untested = [u for u in candidates if isinstance(u, Untested)
                        and u.scale.measurement and not u.why.startswith("not run")]
            best = max(untested, key=lambda u: u.scale.rank(), default=None)
            if best is not None:
                why = best.why.removeprefix("no paired test: ")
                verdict = f"{NO_TEST}: {why}"
            else:
                checked = any(not e.scale.measurement for e in candidates
                              if isinstance(e, Evidence))
                verdict = f"{NOT_RUN}: " + why_not_run(names, checked)
        rows.append(Row(experiment, grid, baseline, proposal,
                        paper_diffs(grid, baseline, proposal), best, verdict, also))
    return rows


def verdict_of(row: Row) -> str:
    """The row's verdict among :data:`VERDICTS` (the first metric's; 'one seed' counted with
    its verdict)."""
    for category in (NOT_RUN, NO_TEST):
        if row.verdict.startswith(category):
            return category
    return row.verdict.replace(ONE_SEED, "")


def paper_of(experiment: Experiment) -> str:
    return PAPERS[experiment.name.split("_")[0]]


def format_row(row: Row) -> str:
    e = row.evidence
    claim = f"| {row.proposal} vs {row.baseline} | `{row.baseline}` -> `{row.proposal}` " \
            f"| {row.paper_diff} |"
    at = "-" if e is None else f"{e.grid}, config {e.config}"
    link = "-" if e is None else results_file(e)
    scale = "-" if e is None else e.scale.short()
    also = "<br>".join(a.at() for a in row.also) or "-"
    if not isinstance(e, Evidence):
        return f"{claim} - | - | {row.verdict} | {scale} | {at} | {link} | {also} |"
    ours = "<br>".join(f"{m.label}: {m.values}, {m.diff}, {m.p}" for m in e.measured)
    seeds = "<br>".join(f"{m.seeds} x {m.units:,}" for m in e.measured)
    verdicts = "<br>".join(m.verdict for m in e.measured)
    return f"{claim} {ours} | {seeds} | {verdicts} | {scale} | {at} | {link} | {also} |"


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
             "baseline -> proposal), one row per claim of the paper however many grids "
             "measure it (a grid that reruns a table at another scale names the same cells "
             "with the same paper numbers): the paper's difference, ours with its 95% "
             "interval (paired over seeds and test examples, 10,000 replicates: "
             "experiments/harness/significance.py through `report`) and the verdict at alpha "
             "0.05 of its most faithful measurement, ranked by: not a smoke run and not "
             "synthetic or sample data (those are never a verdict), the share of the paper "
             "config's training budget, the paper config's model and batch, seeds, test "
             "units (experiments/harness/scale.py); its scale, where it was measured, and "
             "every other measurement of the same claim under 'also measured at', with its "
             "scale and verdict. 'holds': significant in the paper's direction; 'not "
             "significant': the interval holds 0; 'reversed': significant the other way; "
             f"'{NO_TEST}': a results file prints both cells' numbers but no paired test of "
             f"them (linked); '{NOT_RUN}': why (the data is not here, naming the file; else "
             "the command that runs it at the paper config and what docs/cost.md says that "
             f"costs here). {ONE_SEED_NOTE} Where a claim has several metrics, each is on its "
             "own line; the counts use the first (the paper's first column). A grid also "
             "names comparisons of its own, with no paper number for one of the two cells (a "
             "study's settings against the paper's default, the setting it chose against "
             "the paper's cells): they are on the board (paper diff '- (no number for "
             "both)'; 'holds' there reads 'the proposal is better'), one row per grid, and "
             "counted apart, never among the paper's claims.", "",
             "Sources: report's paired tests recomputed on the committed runs folders under "
             "results/" + (f" and `{shown_path(runs)}`" if runs else "") + ", else the "
             "claims tables `report` printed into a committed results file whose runs are "
             "not committed.",
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
                      "diff [95% CI], p | seeds x units | verdict | scale | measured at | "
                      "results | also measured at |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
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
    measured = [r for r in rows if isinstance(r.evidence, Evidence)]
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
                                 "claims on the board (the others: not measured here)")


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

