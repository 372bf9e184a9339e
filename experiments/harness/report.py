"""``report``: a grid's table from the CSV logs of its runs, the paper's numbers beside ours
(mean +- std over seeds), the cost of each cell, the paired tests of the gains the paper
claims (experiments/harness/significance.py) and, with ``--curve``, the validation learning curves
(the grid's ``curve``, else its first metric's validation counterpart); ``--plot`` also
writes them as figures (experiments/harness/plots.py).  It reads only the run folders, so it works
without W&B.  A verdict drawn from one seed says so: its interval covers the test sample,
not the seed.
"""

from __future__ import annotations

from pathlib import Path

from experiments.harness.command_line import add_config_arguments, chosen_config, command_parser
from experiments.harness.grid_model import PROJECT_ROOT, Experiment, Grid, shown_path
from experiments.harness.interleaved_cost import read_cost_file
from experiments.harness.markdown import CLAIMS_HEADER, table_cells
from experiments.harness.preflight import check_folder, root_note
from experiments.harness.runs import (
    COST_COLUMNS,
    MixedRunsError,
    collect,
    configs_with_runs,
    cost_values,
    curve_metric,
    learning_curves,
    settings_differences,
    unfinished_runs,
)
from experiments.harness.scale import scale_line
from experiments.harness.significance import mean_std
from experiments.harness.verdicts import (
    CLAIM_SAMPLES,
    ONE_SEED_NOTE,
    claim_labels,
    claim_results,
    folder_results,
)


def format_report(experiment: Experiment, grid: Grid, config: str) -> str:
    results = collect(experiment, grid, config)
    costs = cost_values(experiment, grid, config)
    lines = [f"### {grid.title}", f"{experiment.name} grid {grid.name}, config {config} "
             f"({experiment.config_path(config).relative_to(PROJECT_ROOT)})",
             scale_line(experiment, grid, config), ""]
    header = ["cell"]
    for label in grid.metrics:
        header += [f"paper {label}", f"ours {label}"]
        if label in grid.relative_to:
            header += [f"paper {label} / {grid.relative_to[label]}",
                       f"ours {label} / {grid.relative_to[label]}"]
    header += list(next(iter(costs.values()), {}))
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def ratio(value, base) -> str:
        return "-" if value is None or not base else f"{value / base:.2f}x"

    root = experiment.grid_folder(grid, config)
    for cell in grid.cells:
        row = [cell.name]
        # runs still training (or stopped before their test): counted, never averaged
        going = len(unfinished_runs(root, cell, grid))
        for label in grid.metrics:
            paper = cell.paper.get(label)
            row.append("-" if paper is None else f"{paper:.2f}")
            vals = results[cell.name][label]
            if not vals:
                row.append(f"not run ({going} unfinished)" if going else "not run")
            else:
                m, s = mean_std(vals)  # sample std; one seed has no spread to show
                spread = f" ± {s:.2f}" if len(vals) > 1 else ""
                more = f"; {going} unfinished" if going else ""
                row.append(f"{m:.2f}{spread} (n={len(vals)}{more})")
            if label in grid.relative_to:
                base = grid.cell(grid.relative_to[label])
                base_vals = results[base.name][label]
                row += [ratio(paper, base.paper.get(label)),
                        ratio(mean_std(vals)[0] if vals else None,
                              mean_std(base_vals)[0] if base_vals else None)]
        row += ["-" if v is None else f"{v:.{COST_COLUMNS[column][2]}f}"
                for column, v in costs[cell.name].items()]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Cost: mean over the seeds of the parameters, training steps/s (training "
              "steps only), peak memory (CPU: the process's peak resident set) and the wall "
              "time of training (validation included); a run's machine and load set them."]
    if grid.cost_file:  # the same cost measured with the models taking turns in one process
        lines += ["", format_cost_file(grid)]
    if grid.claims:
        lines += ["", format_claims(experiment, grid, config)]
    if grid.note:
        lines += ["", grid.note]
    return "\n".join(lines)


def format_claims(experiment: Experiment, grid: Grid, config: str) -> str:
    """Does each gain the paper claims (its ``claims``: baseline -> proposal) hold here?
    For each test metric of the grid with per-example units: the paired comparison over the
    seeds both cells have (seed k with seed k) and the test examples (paired by id) of
    experiments/harness/significance.py, with the paper's difference beside ours
    (:func:`claim_results`)."""
    if not claim_labels(grid):
        return ("Claims: no paired test (this grid's metrics are not test metrics with "
                "per-example predictions).")
    lines = [f"Does the claimed gain hold? Paired over seeds (seed k of the baseline with seed "
             f"k of the proposal: the same seed draws the same initialisation stream and data "
             f"order; seeds are the outer level of the bootstrap) and test examples (paired "
             f"by id, resampled once per replicate for all seeds); 95% percentile interval of "
             f"{CLAIM_SAMPLES:,} paired bootstrap replicates; p from the bootstrap "
             f"(approximate randomisation for MAP / MRR / P@1: units are questions); "
             f"alpha 0.05, no correction for the number of claims "
             f"(experiments/harness/significance.py).", "",
             CLAIMS_HEADER, "|---|---|---|---|---|---|---|---|---|"]
    results = claim_results(experiment, grid, config)
    for r in results:
        shown = "-" if r.paper_diff is None else f"{r.paper_diff:+.2f}"
        scale = r.scale.short() if r.scale else "-"
        if r.comparison is None:
            lines.append(f"| {r.claim} | {r.label} | {shown} | {r.why} | | | | | {scale} |")
            continue
        c = r.comparison
        row = c.row()
        lines.append(f"| {r.claim} | {r.label} | {shown} | {row['baseline']} -> "
                     f"{row['proposal']} | {row['diff']} | {row['p']} ({c.test}) "
                     f"| {r.shown_verdict} | {c.seeds} x {c.units:,} | {scale} |")
    lines += ["", "verdict: 'holds' = significant (p < 0.05) in the paper's direction (the "
              "proposal better, or worse where the paper's difference is negative), "
              "'reversed' = significant the other way; a smoke run, or one on synthetic or "
              "sample data, gets none (its paired test is shown, not a measurement). scale: "
              "the runs' budget and settings against the paper config's (the header's Scale "
              "line names them)."
              + (f" {ONE_SEED_NOTE}" if any(r.one_seed for r in results) else "")]
    return "\n".join(lines)


def format_curves(experiment: Experiment, grid: Grid, config: str) -> str:
    """The learning curves as a markdown table: one row per step, one column per cell
    (mean over seeds, with n when seeds differ)."""
    curves = learning_curves(experiment, grid, config)
    steps = sorted({s for c in curves.values() for s in c})
    lines = [f"### {grid.title}: learning curves, {curve_metric(grid)}",
             f"{experiment.name} grid {grid.name}, config {config}", "",
             "| step | " + " | ".join(curves) + " |", "|---" * (len(curves) + 1) + "|"]
    for step in steps:
        row = []
        for values in (curves[c].get(step) for c in curves):
            if not values:
                row.append("-")
            else:
                row.append(f"{sum(values) / len(values):.2f}"
                           + (f" (n={len(values)})" if len(values) > 1 else ""))
        lines.append(f"| {step} | " + " | ".join(row) + " |")
    if not steps:
        lines.append("| (no validation logged yet) |" + " |" * len(curves))
    return "\n".join(lines)


def no_runs_message(experiment: Experiment, grid: Grid, config: str) -> str | None:
    """One line when ``grid`` has no runs with ``config``: which configs have some, or the
    command that runs it when none has; None when it has runs with ``config``."""
    found = configs_with_runs(experiment, grid)
    if config in found:
        return None
    if not found:
        flag = {"paper": "", "smoke": " --smoke"}.get(config, f" --config {config}")
        return (f"no runs of {grid.name} yet, with any config (under "
                f"{shown_path(experiment.grid_folder(grid, config).parent)}); run it: python "
                f"experiments/{experiment.name}.py grid {grid.name}{flag}")
    use = " or ".join("--smoke or --config smoke" if c == "smoke" else f"--config {c}"
                      for c in found)
    return f"no runs of {grid.name} with config {config}; runs exist for: {', '.join(found)} " \
           f"(use {use})"


def compare_printouts(ours: str, committed: str, committed_name: str,
                      committed_machine: str) -> str:
    """Whether a printout's numbers (tables' cells but :data:`LOAD_COLUMNS`) equal a committed
    printout's, and if not how many differ, the first few, and the two machines (this one
    from :func:`lit_models.base.cpu_host` and torch's dispatch)."""
    from lit_models.base import machine_settings

    mine, theirs = table_cells(ours), table_cells(committed)
    shared = [k for k in mine if k in theirs]
    if not shared:
        return (f"Not comparable with {committed_name}: no table of this printout is in it "
                "(another grid or config?).")
    differ = [k for k in shared if mine[k] != theirs[k]]
    machine = machine_settings()
    here = (f"{machine['machine/cpu_model']}, "
            f"{'AVX-512' if machine['machine/cpu_has_avx512f'] is True else 'no AVX-512'}"
            f"{', AMX' if machine['machine/cpu_has_amx_tile'] is True else ''}, torch's "
            f"{machine['machine/cpu_capability']} kernels (each run's machine and threads: "
            "machine/* in its hparams.yaml)")
    if not differ:
        return (f"Every number above equals the committed printout {committed_name} "
                f"({len(shared)} table cells; steps/s, peak memory and wall time depend on "
                f"the machine's load and are not compared). Committed on: {committed_machine}. "
                f"Here: {here}.")
    shown = "; ".join(f"{row} {column}: {mine[(t, row, column)]} (committed "
                      f"{theirs[(t, row, column)]})" for t, row, column in differ[:4])
    return (f"{len(differ)} of {len(shared)} numbers differ from the committed printout "
            f"{committed_name}: {shown}{' ...' if len(differ) > 4 else ''}. Committed on: "
            f"{committed_machine}. Here: {here}. Another CPU's kernels round differently and "
            "training carries the difference on (docs/reproducibility.md, 'Across hosts'); "
            "with the same machine and threads the numbers are the same.")


def print_report(experiment: Experiment, argv: list[str]) -> None:
    p = command_parser(experiment, "report")
    p.add_argument("grid", nargs="?", default=None,
                   help=f"one of: {', '.join(experiment.grids)} (default: every grid)")
    add_config_arguments(p, experiment)
    p.add_argument("--curve", action="store_true",
                   help="also print the validation learning curves (the grid's curve metric, "
                        "else its first metric's validation counterpart)")
    p.add_argument("--plot", action="store_true",
                   help="also write PNGs: validation curves, paper vs ours, the claims (and "
                        "the CoDA gate over steps when the runs logged it)")
    p.add_argument("--out", default=None,
                   help="folder of the --plot files (default: the grid's run folder's plots/, "
                        "runs/<experiment>/<grid>-<config>/plots)")
    p.add_argument("--slices", nargs="*", default=None, metavar="NAME",
                   help="also test each claim within slices of the test set (the "
                        "experiment's declared slices; all of them when no name is given)")
    p.add_argument("--against", default=None, metavar="DIR", type=Path,
                   help="another runs root (as $ATTNREPRO_RUNS) holding the same grid and "
                        "config made otherwise (a precision, a machine): each cell's runs "
                        "there against its runs here, seed k with seed k, paired over the "
                        "test examples")
    p.add_argument("--compare", default=None, metavar="FILE",
                   help="a committed printout of the same report: say after it whether every "
                        "number equals it (the load-dependent cost columns aside) and, if "
                        "not, which and on what machines")
    p.add_argument("--compare-machine", default="not stated", metavar="TEXT",
                   help="the machine the --compare printout was made on, as its results "
                        "file records it")
    args = p.parse_args(argv)
    if args.slices is not None:
        experiment.slicings(args.slices)  # an unknown name: one line before any work
    committed = None
    if args.compare:
        try:
            committed = Path(args.compare).read_text(encoding="utf-8")
        except OSError as err:
            raise SystemExit(f"{experiment.name}.py report --compare {args.compare}: cannot "
                             f"read it ({err.strerror})") from None
    grids = [experiment.grid(args.grid)] if args.grid else list(experiment.grids.values())
    config = chosen_config(experiment, args)
    parts = []
    for g in grids:
        missing = no_runs_message(experiment, g, config)
        if missing:
            parts.append(missing)
            continue
        if args.plot:  # before any figure is drawn: a folder it cannot write is one line
            check_folder(f"{experiment.name}.py report", Path(args.out) if args.out
                         else experiment.grid_folder(g, config) / "plots",
                         "the folder of --out" if args.out else root_note("runs"))
        try:
            parts.append(format_report(experiment, g, config))
        except MixedRunsError as err:
            raise SystemExit(f"{experiment.name}.py report {g.name}: {err}") from None
        if args.against is not None:
            parts.append(format_against(experiment, g, config, args.against))
        if args.curve:
            parts.append(format_curves(experiment, g, config))
        if args.slices is not None:
            from experiments.harness.slice_report import report_slices

            parts.append(report_slices(experiment, g, config, args.slices, args.plot, args.out))
        if args.plot:
            from experiments.harness.plots import write_plots  # matplotlib: only when asked

            parts.append(write_plots(experiment, g, config, args.out))
    if committed is not None:
        parts.append(compare_printouts("\n\n".join(parts), committed, args.compare,
                                       args.compare_machine))
    print("\n\n".join(parts))


def format_against(experiment: Experiment, grid: Grid, config: str, other: Path) -> str:
    """``report --against DIR``: each cell of the grid against itself in the runs root
    ``other`` (experiments/harness/verdicts.py ``folder_results``), with the settings the
    two folders' runs differ in."""
    here = experiment.grid_folder(grid, config)
    there = other / experiment.name / here.name
    if not there.is_dir():
        return (f"Against {shown_path(there)}: no such folder (--against names a runs root, "
                f"as $ATTNREPRO_RUNS: the grid's runs are in "
                f"<root>/{experiment.name}/{here.name})")
    results = folder_results(experiment, grid, config, other)
    pair = next(((a, there / a.name) for a in sorted(here.iterdir())
                 if (a / "config.yaml").is_file() and (there / a.name / "config.yaml").is_file()),
                None)
    if pair is None:
        differ = "no run of the same name in both folders to compare settings with"
    else:
        keys = settings_differences(list(pair), names=["here", "there"])
        differ = ("the settings the runs differ in (" + pair[0].name + "'s config.yaml): "
                  + ("; ".join(f"{k}: {v['here']!r} here, {v['there']!r} there"
                               for k, v in keys.items()) if keys else "none"))
    lines = [f"### {grid.title}: against {shown_path(there)}",
             f"Each cell against itself in the other runs folder, seed k with seed k (the "
             f"same initialisation and data order), paired over the test examples by id; the "
             f"other folder's runs minus these, 95% percentile interval of {CLAIM_SAMPLES:,} "
             f"paired bootstrap replicates, p as the claims' (experiments/harness/"
             f"significance.py); {differ}.", "",
             "| cell | metric | here | there | there - here [95% CI] | p | seeds x units |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if r.comparison is None:
            lines.append(f"| {r.cell} | {r.label} | {r.why} | | | | |")
            continue
        row = r.comparison.row()
        lines.append(f"| {r.cell} | {r.label} | {row['baseline']} | {row['proposal']} | "
                     f"{row['diff']} | {row['p']} | {r.comparison.seeds} x "
                     f"{r.comparison.units:,} |")
    if not results:
        lines.append("| no cell has runs in either folder | | | | | | |")
    return "\n".join(lines)


def format_cost_file(grid: Grid) -> str:
    """The grid's interleaved cost as ``report`` prints it: per cell its parameters, steps/s,
    their ratio to the baseline's with its 95% interval, the tensor peak of a training step
    and its ratio; the command, machine and date it was measured with."""
    costs = read_cost_file(grid)
    if costs is None:
        return (f"Training cost, interleaved: not measured yet ({grid.cost_file} does not "
                "exist; the grid's note names the command that writes it).")
    if not costs:
        return f"Training cost, interleaved: {grid.cost_file} holds no row."
    first = next(iter(costs.values()))
    base, s = first.baseline, first.setting
    lines = [f"Training cost, interleaved: the models taking turns step by step on the same "
             f"batches in one process ({grid.cost_file}: `{s.get('command', 'not recorded')}`; "
             f"config {s.get('config', '?')}'s model and data, {s.get('steps', '?')} timed "
             f"steps each; {s.get('machine', 'machine not recorded')}, {s.get('threads', '?')} "
             f"thread(s), {s.get('date', 'date not recorded')}, commit "
             f"{s.get('commit', 'not recorded')}). Steps/s: training steps (forward, loss, "
             "backward, Adam) per second; 95% interval: paired bootstrap over the (round, "
             "batch) pairs; step tensor MB: the peak of the bytes held by torch tensors in one "
             "training step beyond those held before it.", "",
             f"| cell (interleaved) | parameters (M) | steps/s | / {base} [95%] | step tensor MB "
             f"| / {base} |", "|---|---|---|---|---|---|"]
    base_mb = costs[base].step_tensor_mb if base in costs else None
    for cell in grid.cells:
        c = costs.get(cell.name)
        if c is None:
            lines.append(f"| {cell.name} | not measured | | | | |")
            continue
        memory = "-" if c.step_tensor_mb is None else f"{c.step_tensor_mb:.1f}"
        memory_ratio = (f"{c.step_tensor_mb / base_mb:.2f}x" if c.step_tensor_mb is not None
                        and base_mb else "-")
        lines.append(f"| {cell.name} | {c.parameters / 1e6:.3f} | {c.steps_per_s:.2f} | "
                     f"{c.ratio:.2f}x [{c.low:.2f}, {c.high:.2f}] | {memory} | {memory_ratio} |")
    return "\n".join(lines)
