"""The committed results come out again: what is derived from committed files is derived
again here and compared (each report of REPORTS byte for byte from its committed runs;
the BLEU and per-seed tables from their committed JSON and CSV), every results/*.md names
the commit, command, machine and threads that made it, results/README.md indexes every
file, and ``make results`` (the reruns that need training or timing) writes none of the
files these tests read."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"

#: curves files written by experiments.harness.curves from committed runs: (name, runs folder, grid,
#: config)
CURVES = [("coda_mlu_study", "coda_mlu_study_runs", "study", "study"),
          ("coda_mlu_table6_100k_curves", "coda_mlu_table6_runs", "table6_chosen", "table6_100k")]

# files a command writes whole: a hand-written footer would be lost at the next run, so the
# file names its command itself
WRITTEN_WHOLE = {"coda_mlu_curve.md": "(made by `python -m experiments.curves ",
                 **{f"{name}.md": f"(made by `ATTNREPRO_RUNS=results/{folder} python -m "
                                  "experiments.curves " for name, folder, *_ in CURVES}}

PROVENANCE = ("Commit", "Command", "Machine", "Threads", "Rerun")

#: what a Machine field names: the cores, the CPU model and torch's CPU capability
MACHINE_FACTS = {"cores": r"\b\d+ cores\b", "CPU model": r"\b(?:AMD EPYC|Intel|Xeon|Apple M\d)",
                 "capability": r"\b(?:AVX-?512|AVX2|NEON|SVE)\b"}

#: results files whose machine is not recorded in full, and why no record of it exists (the
#: runs, their committed hparams.yaml and cost rows, and the files' and runs' commits searched)
MACHINE_NOT_RECORDED = {
    "adm_decoder_bench.md": "a benchmark of 2026-11-23: it prints no machine, its commits name "
                            "none",
    "coda_mlu_curve.md": "runs of 2026-11-23, before runs logged machine/* (172447e), their "
                         "commit unrecorded; folders not committed",
    "coda_mlu_study.md": "runs log no core count and predate machine/cpu_model (feaed29)",
    "coda_mlu_table6_100k_curves.md": "runs log no core count and predate machine/cpu_model "
                                      "(feaed29)",
    "coda_mlu_table6_100k.md": "runs before machine/cpu_model (feaed29): the CPU model is not "
                               "in their hparams.yaml",
    "coda_mt_chosen.md": "runs before machine/cpu_model (feaed29): the CPU model is not in "
                         "their hparams.yaml",
    "coda_mt_small.md": "runs of 2026-11-23, before machine/* (172447e); only BLEU files "
                        "committed",
    "coda_ranking_wikiqa_cpu.md": "the first runs (2026-11-23) predate machine/* (172447e); "
                                  "only their final scores committed (the rerun records it)",
    "decoding_bench.md": "a benchmark of 2026-11-23: it prints no machine, its commits name none",
    "dwin_classification_cost.md": "the runs' hparams.yaml (machine/*) were left uncommitted in "
                                   "/work/cost_runs",
    "dwin_mt_cost.md": "the grid's runs (machine/*) were left uncommitted; the runs it paused "
                       "predate machine/cpu_model",
    "dwin_mt_table4_speed.md": "runs of 2026-11-23, before machine/* (172447e); folders not "
                               "committed",
    "model_cost_interleaved.md": "the benchmark prints no machine; no measurement beside the "
                                 "before/after pair records one",
    "qadm_mt_small.md": "runs of 2026-11-23, before machine/* (172447e); only BLEU files "
                        "committed",
    "sst_table5_repro.md": "DW seeds 0-1 predate machine/cpu_model (feaed29)",
    "window_variants_bench.md": "a benchmark (no machine printed); the runs beside it predate "
                                "machine/cpu_model",
}

#: results files whose numbers do not depend on the machine, and why
MACHINE_FREE = {"CLAIMS.md": "paired tests recomputed by seeded numpy on committed files; the "
                             "runs' machines are in their own results files"}


def machine_problem(name: str, machine: str) -> str | None:
    """What is wrong with a results file's Machine field, None when nothing: unless the file
    is listed (MACHINE_NOT_RECORDED, MACHINE_FREE), it names every fact of MACHINE_FACTS and
    says 'not recorded' nowhere; a file that lists 'not recorded' says it."""
    if name in MACHINE_FREE:
        return None
    if name in MACHINE_NOT_RECORDED:
        if "not recorded" not in machine:
            return (f"{name}: listed in MACHINE_NOT_RECORDED but its Machine field records "
                    f"everything; remove it from the list")
        return None
    if "not recorded" in machine:
        return (f"{name}: Machine says 'not recorded'; find the machine (runs' hparams.yaml "
                f"machine/*, cost rows, git log -p) or list the file in MACHINE_NOT_RECORDED "
                f"with the reason")
    missing = [fact for fact, pattern in MACHINE_FACTS.items() if not re.search(pattern, machine)]
    if missing:
        return f"{name}: Machine names no {', no '.join(missing)}: {machine!r}"
    return None


def test_machine_problem_catches_a_machine_not_recorded():
    full = "2 cores, AMD EPYC, AVX-512, torch 2.13.0+cpu."
    assert machine_problem("x.md", full) is None
    assert "'not recorded'" in machine_problem("x.md", "not recorded (cores, CPU model).")
    assert "no CPU model" in machine_problem("x.md", "2 cores, AVX-512.")
    assert "no cores, no capability" in machine_problem("x.md", "AMD EPYC.")
    assert machine_problem("decoding_bench.md", "2 cores; CPU model not recorded.") is None
    assert "remove it" in machine_problem("decoding_bench.md", full)


def table_rows(text: str, header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the markdown table whose header line starts with
    ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


# -- `report` on committed runs -----------------------------------------------------------------
def printed_block(text: str, section: str) -> str:
    """What `report` printed in ``section`` of a results file: the lines after 'What
    `report` printed:' up to the paragraph 'Reading it.'."""
    body = text.split(section, 1)[1]
    return body.split("What `report` printed:\n\n", 1)[1].split("\nReading it.", 1)[0]


# (results file, its section, committed runs folder, script, report arguments): `report` on
# the committed runs prints the file's 'What `report` printed:' block of that section
REPORTS = [
    ("sst_table5_repro.md", "## CoDA Table 5, SST column", "sst_table5_runs",
     "experiments/coda_sentiment.py", ["table5", "--config", "repro"]),
    ("coda_ranking_wikiqa_cpu.md", "## Rerun with per-example predictions", "coda_ranking_runs",
     "experiments/coda_ranking.py", ["table2", "--config", "cpu"]),
    ("sst_table5_repro.md", "## Differentiable Window Table 5, SST column", "sst_table5_runs",
     "experiments/dwin_classification.py", ["table5", "--config", "repro"]),
    ("coda_mt_chosen.md", "# CoDA Table 4 path", "coda_mt_chosen_runs", "experiments/coda_mt.py",
     ["table4_chosen", "--config", "small", "--curve"]),
    ("coda_mlu_table6_100k.md", "# CoDA Table 6 at the paper's 100K steps", "coda_mlu_table6_runs",
     "experiments/coda_mlu.py", ["table6_chosen", "--config", "table6_100k", "--curve"]),
    ("imdb_table5.md", "## CoDA Table 5, IMDb column", "imdb_table5_runs",
     "experiments/coda_sentiment.py", ["table5", "--config", "paper"]),
    ("imdb_table5.md", "## Differentiable Window Table 5, IMDB column", "imdb_table5_runs",
     "experiments/dwin_classification.py", ["table5", "--config", "paper"]),
    ("attention_compare.md", "## Runs so far: SST", "attention_compare_runs",
     "experiments/attention_compare.py", ["sst", "--config", "paper"]),
    ("attention_compare.md", "## Runs so far: IMDb", "attention_compare_runs",
     "experiments/attention_compare.py", ["imdb", "--config", "paper"]),
    # report --slices (issue 48): the claims within slices of the test set
    ("coda_mlu_table6_100k.md", "## Slices: where the gain is", "coda_mlu_table6_runs",
     "experiments/coda_mlu.py", ["table6_chosen", "--config", "table6_100k", "--slices"]),
    ("sst_table5_repro.md", "## Slices of Differentiable Window Table 5, SST column",
     "sst_table5_runs", "experiments/dwin_classification.py",
     ["table5", "--config", "repro", "--slices"]),
    ("sst_table5_repro.md", "## Slices of CoDA Table 5, SST column", "sst_table5_runs",
     "experiments/coda_sentiment.py", ["table5", "--config", "repro", "--slices"]),
    ("coda_ranking_wikiqa_cpu.md", "## Slices of the rerun", "coda_ranking_runs",
     "experiments/coda_ranking.py", ["table2", "--config", "cpu", "--slices"]),
    ("imdb_table5.md", "## Slices of CoDA Table 5, IMDb column", "imdb_table5_runs",
     "experiments/coda_sentiment.py", ["table5", "--config", "paper", "--slices"]),
    ("imdb_table5.md", "## Slices of Differentiable Window Table 5, IMDB column",
     "imdb_table5_runs", "experiments/dwin_classification.py",
     ["table5", "--config", "paper", "--slices"]),
]


def report_env(tmp_path, folder):
    """A copy of the committed runs in ``results/<folder>`` (a test never writes into tracked
    files, and report must find nothing else) and the environment that points report at it:
    its own cache and home, one thread, no W&B."""
    runs = tmp_path / "runs"
    shutil.copytree(RESULTS / folder, runs)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(ATTNREPRO_RUNS=str(runs), ATTNREPRO_CACHE=str(tmp_path / "cache"),
               HOME=str(tmp_path), OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    return runs, env


@pytest.mark.slow
@pytest.mark.parametrize("name, section, folder, script, args", REPORTS,
                         ids=[f"{r[0]}:{Path(r[3]).stem}" + ("-slices" * ("--slices" in r[4]))
                              for r in REPORTS])
def test_report_comes_out_of_the_committed_runs(tmp_path, name, section, folder, script, args):
    """The command the file names, on a copy of the committed runs (report writes nothing,
    and a test never writes into tracked files), prints the committed table to the byte."""
    runs, env = report_env(tmp_path, folder)
    proc = subprocess.run([sys.executable, script, "report", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = (RESULTS / name).read_text()
    assert proc.stdout == printed_block(text, section)
    assert f"ATTNREPRO_RUNS=results/{folder} python {script} report {' '.join(args)}" in text


# (results file, its section, committed runs folder, the other precision's runs folder, script,
# report arguments): `report --against` (issue 50: bf16-mixed against float32, each cell with
# itself, seed k with seed k) on the committed runs prints the section's block
AGAINST = [
    ("bf16_cost.md", "### CoDA Table 5, SST column", "sst_table5_runs",
     "bf16_parity_runs/bf16-mixed", "experiments/coda_sentiment.py",
     ["table5", "--config", "repro"]),
    ("bf16_cost.md", "### The MLU demo", "bf16_parity_runs/32-true",
     "bf16_parity_runs/bf16-mixed", "experiments/coda_mlu.py", ["table6", "--config", "demo"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, section, folder, other, script, args", AGAINST,
                         ids=[f"{r[0]}:{Path(r[4]).stem}" for r in AGAINST])
def test_report_against_comes_out_of_the_committed_runs(tmp_path, name, section, folder, other,
                                                        script, args):
    """As above, with ``--against`` the other folder: the runs of both precisions are
    committed, and the file's block is what report prints on copies of them (the copy's path
    printed as the committed folder's)."""
    runs, env = report_env(tmp_path, folder)
    there = tmp_path / "there"
    shutil.copytree(RESULTS / other, there)
    proc = subprocess.run([sys.executable, script, "report", *args, "--against", str(there)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = (RESULTS / name).read_text()
    assert proc.stdout.replace(str(there), f"results/{other}") == printed_block(text, section)
    assert (f"ATTNREPRO_RUNS=results/{folder} python {script} report {' '.join(args)} "
            f"--against results/{other}") in text


def test_printed_block_is_the_text_between_its_markers():
    text = ("# t\n\n## A\n\nWhat `report` printed:\n\nx\n\nReading it. no\n\n## B\n\n"
            "What `report` printed:\n\n| a |\n|---|\n| 1 |\n\nReading it. yes\n")
    assert printed_block(text, "## B") == "| a |\n|---|\n| 1 |\n"
    assert printed_block(text, "## A") == "x\n"


# -- tables built from committed JSON and CSV ----------------------------------------------------
def bleu_files(folder: Path, pattern: str) -> dict[str, dict]:
    return {re.fullmatch(pattern, p.name).group(1): json.loads(p.read_text())
            for p in sorted(folder.glob("*-bleu-test.json"))}


def check_bleu_details(rows: list[list[str]], bleu: dict[str, dict]) -> None:
    """Each row of a BLEU details table (name, tokenized, sacreBLEU, BP, hyp / ref tokens,
    and n-gram precisions where the table has them) is the bleu-test.json of that name."""
    for name, tokenized, sacre, bp, lengths, *precisions in rows:
        b, s = bleu[name]["bleu"], bleu[name]["sacrebleu"]
        assert tokenized == f"{b['score']:.2f}" and sacre == f"{s['score']:.2f}"
        assert bp == f"{b['bp']:.3f}" and lengths == f"{b['sys_len']} / {b['ref_len']}"
        if precisions:
            assert precisions == [" / ".join(f"{p:.1f}" for p in b["precisions"])]


def test_coda_mt_small_bleu_tables_are_the_committed_bleu_files():
    text = (RESULTS / "coda_mt_small.md").read_text()
    bleu = bleu_files(RESULTS / "coda_mt_small", r"(.+)-bleu-test\.json")
    details = table_rows(text, "| model | tokenized BLEU")
    assert sorted(r[0] for r in details) == sorted(bleu) == ["coda", "transformer"]
    assert all(len(r) == 5 for r in details)
    check_bleu_details(details, bleu)
    report = {r[0]: r[2] for r in table_rows(text, "| cell | paper BLEU | ours BLEU")}
    assert report == {m: f"{bleu[m]['bleu']['score']:.2f} (n=1)" for m in bleu}


def test_coda_mt_chosen_bleu_details_are_the_committed_bleu_files():
    text = (RESULTS / "coda_mt_chosen.md").read_text()
    runs = RESULTS / "coda_mt_chosen_runs" / "coda_mt" / "table4_chosen-small"
    bleu = {p.parent.name.removesuffix("-seed0"): json.loads(p.read_text())
            for p in sorted(runs.glob("*-seed0/bleu-test.json"))}
    details = table_rows(text, "| model | tokenized BLEU")
    assert [r[0] for r in details] == ["transformer", "coda", "coda_beta0.25"]
    assert sorted(bleu) == sorted(r[0] for r in details)
    assert all(len(r) == 6 for r in details)
    check_bleu_details(details, bleu)


def test_qadm_mt_small_bleu_tables_are_the_committed_bleu_files():
    text = (RESULTS / "qadm_mt_small.md").read_text()
    bleu = bleu_files(RESULTS / "qadm_mt_small", r"en_vi-(.+)-bleu-test\.json")
    details = table_rows(text, "| attention | tokenized BLEU")
    assert sorted(r[0] for r in details) == sorted(bleu) == ["additive", "aqt", "mqt"]
    assert all(len(r) == 6 for r in details)
    check_bleu_details(details, bleu)
    test_bleu = {r[0]: r[4] for r in table_rows(text, "| cell | paper Dev BLEU")}
    for name, b in bleu.items():
        assert test_bleu[f"en_vi-{name}"] == f"{b['bleu']['score']:.2f} (n=1)"


def test_wikiqa_tables_are_the_committed_per_seed_csv():
    text = (RESULTS / "coda_ranking_wikiqa_cpu.md").read_text()
    with open(RESULTS / "coda_ranking_wikiqa_cpu.csv", newline="") as f:
        seeds = list(csv.DictReader(f))
    per_seed = table_rows(text, "| cell | seed | dev MAP (final)")
    assert len(per_seed) == len(seeds) == 6
    for row, s in zip(per_seed, seeds):
        assert row == [s["cell"], s["seed"], *(f"{100 * float(s[k]):.2f}" for k in
                       ("test_map", "test_mrr", "test_p_at_1", "val_map_best"))]
    report = {r[0]: r for r in table_rows(text, "| cell | paper MAP | ours MAP")}
    for cell in ("wikiqa-softmax", "wikiqa-coda"):
        values = {k: [100 * float(s[k]) for s in seeds if s["cell"] == cell]
                  for k in ("test_map", "test_mrr", "test_p_at_1")}
        shown = [f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f} (n=3)"
                 for v in values.values()]
        assert [report[cell][i] for i in (2, 4, 6)] == shown


# (results file stem, the mechanism, {path: its name in the table}): a C++ kernel against the
# path it replaced, each measured by model_cost in its own process against its own softmax
KERNEL_TABLES = [
    ("structured_crf", "structured",
     {"python": "Python recursion (`ATTNREPRO_CRF_CPP=0`)", "cpp": "C++ chain (default)"}),
    ("additive_cpp", "additive",
     {"python": "blocked tanh tensor (`ATTNREPRO_ADDITIVE_CPP=0`)", "cpp": "C++ scores (default)"}),
]


@pytest.mark.parametrize(("stem", "mechanism", "paths"), KERNEL_TABLES,
                         ids=[stem for stem, _, _ in KERNEL_TABLES])
def test_kernel_table_is_its_rows(stem, mechanism, paths):
    """results/<stem>.md's table: each (data, path) row is what its --out file holds (steps/s,
    the ratio to softmax with its interval, step tensor MB), from the commit it names."""
    text = (RESULTS / f"{stem}.md").read_text()
    for data in ("imdb", "sst"):
        for path, name in paths.items():
            rows = [json.loads(line) for line in
                    (RESULTS / stem / f"{data}-{path}.jsonl").read_text().splitlines()]
            by = {r["mechanism"]: r for r in rows}
            s, t = by["softmax"], by[mechanism]
            assert t["setting"]["commit"] in provenance(text)["Commit"]
            row = (f"| {data} | {name} | {s['steps_per_s']:.2f} | {t['steps_per_s']:.2f} | "
                   f"{t['ratio_vs_softmax']:.2f}x [{t['ratio_low']:.2f}, {t['ratio_high']:.2f}] | "
                   f"{s['step_tensor_mb']:.1f} | {t['step_tensor_mb']:.1f} |")
            assert row in text, f"{stem}.md: no row {row}"


# -- every results file: where it came from ------------------------------------------------------
def provenance(text: str) -> dict[str, str]:
    """The fields of a results file's closing '## Provenance' section."""
    tail = text.split("\n## Provenance\n", 1)[1]
    return dict(re.findall(r"^- (\w+): (.+)$", tail, flags=re.M))


def commits_named(field: str) -> set[str]:
    return set(re.findall(r"\b[0-9a-f]{7}\b", field))


def is_commit(sha: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=ROOT,
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("name", sorted(p.name for p in RESULTS.glob("*.md")
                                        if p.name != "README.md"))
def test_every_results_file_names_commit_command_machine_and_threads(name):
    text = (RESULTS / name).read_text()
    if name in WRITTEN_WHOLE:
        assert WRITTEN_WHOLE[name] in text
        made_at = re.search(r"^Runs made at: (.+)$", text, flags=re.M)
        assert made_at, f"{name}: no 'Runs made at:' line (experiments.curves --runs-commit)"
        named = commits_named(made_at.group(1))
        assert named, f"{name}: 'Runs made at:' names no commit"
        if shutil.which("git") and (ROOT / ".git").exists():
            assert {c for c in named if not is_commit(c)} == set(), name
        if "not recorded" in made_at.group(1):
            assert name in MACHINE_NOT_RECORDED, f"{name}: runs' commit not recorded, not listed"
        machine = re.search(r"^Machine \(.*?\): (.+)$", text, flags=re.M)
        assert machine, f"{name}: no 'Machine (...):' line (experiments.curves format_machine)"
        problem = machine_problem(name, machine.group(1))
        assert problem is None, problem
        return
    assert text.count("\n## Provenance\n") == 1, f"{name}: no '## Provenance' section"
    fields = provenance(text)
    assert tuple(fields) == PROVENANCE, f"{name}: {tuple(fields)}"
    assert all(len(fields[k]) > 10 for k in ("Commit", "Command", "Machine", "Rerun")), fields
    problem = machine_problem(name, fields["Machine"])
    assert problem is None, problem
    assert re.search(r"\d", fields["Threads"]), fields["Threads"]
    named = commits_named(fields["Commit"])
    assert named, f"{name}: no commit in {fields['Commit']!r}"
    if shutil.which("git") and (ROOT / ".git").exists():
        assert {c for c in named if not is_commit(c)} == set(), name
    rerun = fields["Rerun"]
    assert any(k in rerun for k in ("make results", "long", "re-derived", "not in `make")), rerun


def test_machine_lists_name_existing_results_files():
    for name in (*MACHINE_NOT_RECORDED, *MACHINE_FREE):
        assert (RESULTS / name).is_file(), f"MACHINE_NOT_RECORDED names {name}: no such file"


def test_provenance_reads_the_closing_section():
    text = "# t\n\n- Commit: not this\n\n## Provenance\n\n- Commit: abc1234 (x).\n- Rerun: long.\n"
    assert provenance(text) == {"Commit": "abc1234 (x).", "Rerun": "long."}
    assert commits_named("abc1234 and 7d238e9; not 12345678 or abc12") == {"abc1234", "7d238e9"}


# -- results/README.md: the index -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name, folder, grid, config", CURVES, ids=[c[0] for c in CURVES])
def test_mlu_curves_come_out_of_the_committed_runs(tmp_path, name, folder, grid, config):
    """The CoDA decoder study's table and curves (results/coda_mlu_study.{md,csv}) and Table
    6's 100K-step curves: the command the file's last line names (with the commit of its runs,
    --runs-commit), on a copy of the committed run files, writes them to the byte (into
    tmp_path: a test never writes into tracked
    files), and the gate figure beside them (the runs logged the gate)."""
    runs, env = report_env(tmp_path, folder)
    out = tmp_path / "out" / name
    committed = (RESULTS / f"{name}.md").read_text()
    command = shlex.split(re.search(r"\(made by `(.+)`\)\n\Z", committed).group(1))
    prefix = [f"ATTNREPRO_RUNS=results/{folder}", "python", "-m", "experiments.curves",
              "coda_mlu", grid]
    assert command[:6] == prefix and command[-4:] == ["--config", config, "--out",
                                                      f"results/{name}"], command
    proc = subprocess.run([sys.executable, *command[2:-1], str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert out.with_suffix(".csv").read_bytes() == (RESULTS / f"{name}.csv").read_bytes()
    made = out.with_suffix(".md").read_text().replace(str(out), f"results/{name}") \
        .replace(str(runs), f"results/{folder}")
    assert made == committed
    assert (out.parent / f"{name}-gates.png").exists()


def test_results_index_lists_every_file_and_nothing_else():
    """Every entry of results/ has a row; a row names an entry that exists, or one that
    ``make results`` creates at its first run."""
    index = (RESULTS / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \|(.*)$", index, flags=re.M))
    present = {p.name for p in RESULTS.iterdir() if p.name != "README.md"}
    assert present - set(rows) == set(), "not in results/README.md"
    for name in set(rows) - present:
        assert "absent until its first run" in rows[name], f"{name}: listed but absent"


# -- make results ------------------------------------------------------------------------------
READ_BY_TESTS = {*(p for r in REPORTS for p in (RESULTS / r[2]).rglob("*")),
                 RESULTS / "coda_mt_small.md",
                 *(RESULTS / "coda_mt_small").glob("*"), RESULTS / "qadm_mt_small.md",
                 *(RESULTS / "qadm_mt_small").glob("*"), RESULTS / "coda_ranking_wikiqa_cpu.md",
                 RESULTS / "coda_ranking_wikiqa_cpu.csv", *RESULTS.glob("*.md")}


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_results_writes_under_results_and_no_file_a_test_reads():
    """What each rerun writes (``make -n``: printed, not run): its output replaces a file
    only when the command succeeded, never a results/*.md or a file compared above."""
    out = subprocess.run(["make", "-n", "results"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    written = re.findall(r"> (\S+)\.part && mv \1\.part (\S+)", out.stdout)
    assert len(written) == 11, out.stdout
    # the figure study writes its own files (atomically) into the folder it is given
    assert "experiments.figures coda_fig2 --out results" in out.stdout
    for part, target in written:
        assert part == target and target.startswith("results/"), target
        assert (ROOT / target).resolve() not in {p.resolve() for p in READ_BY_TESTS}, target
    for command in ("benchmarks.decoding", "benchmarks.model_cost --model translation",
                    "--mechanisms additive,density,structured --contexts decoder,decoder_step",
                    "--lengths 512,1024 --contexts multihead --warmup 3 --interleave 30",
                    "coda_mlu.py grid table6 --config demo",
                    "dwin_classification.py grid cost --config speed",
                    "dwin_mt.py grid table4 --config speed"):
        assert command in out.stdout, command
