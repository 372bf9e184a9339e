"""``keep`` (experiments/harness/keep.py): a grid's finished runs copied into a folder to
commit, the input text left out and its token count kept; unfinished runs named, not
copied; a run kept before and unchanged passed over, a changed one refused without --force;
token counts taken from the run's own test set (``--tokens-from-data``), in place; and the
input-length slice read from the kept counts as from the text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from experiments import coda_sentiment
from experiments.harness.runner import main as run_script
from experiments.harness.slices import slice_results
from tests.experiments.test_report import write_run

GROUP = ("coda_sentiment", "table5-smoke")


class TinyTestSet:
    """A DataModule stand-in whose test batches hold examples of 1..6 tokens, ids 0..5, in
    batches of 4 (what --tokens-from-data reads: ``index`` and ``mask``)."""

    def __init__(self, n: int = 6):
        self.n = n
        self.prepared = self.set_up = False

    def prepare_data(self):
        self.prepared = True

    def setup(self, stage):
        assert stage == "test" and self.prepared
        self.set_up = True

    def test_dataloader(self):
        assert self.set_up
        lengths = list(range(1, self.n + 1))
        for start in range(0, self.n, 4):
            chunk = lengths[start:start + 4]
            mask = torch.zeros(len(chunk), max(chunk), dtype=torch.bool)
            for row, n in enumerate(chunk):
                mask[row, :n] = True
            yield {"index": torch.arange(start, start + len(chunk)), "mask": mask}


def rows(n: int = 6, text: bool = True, tokens: bool = True) -> list[dict]:
    """What a classifier's test writes: the input text (decoded words: 1 here), the number
    of tokens the model read (1..6), gold, prediction, log_probs."""
    out = []
    for i in range(n):
        row = {"id": i, **({"input": "decoded words"} if text else {}),
               **({"tokens": i + 1} if tokens else {}), "gold": i % 2,
               "prediction": i % 2 if i != 1 else 0, "log_probs": [-0.5, -1.0]}
        out.append(row)
    return out


def runs(tmp_path: Path, monkeypatch, text: bool = True, tokens: bool = True) -> Path:
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    group = tmp_path / "runs" / Path(*GROUP)
    for cell in ("sst-transformer", "sst-coda"):
        folder = write_run(group / f"{cell}-seed0", rows(text=text, tokens=tokens),
                           {"test/acc": 5 / 6},
                           n_parameters=10)
        data = {"class_path": "tests.experiments.test_keep.TinyTestSet",
                "init_args": {"n": 6}}
        (folder / "config.yaml").write_text(yaml.safe_dump({"data": data, "seed": 0}))
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "last.ckpt").write_text("weights")
        (folder / "output.log").write_text("log")
    # a run that stopped before its test: no test metric
    write_run(group / "sst-coda-seed1", rows(text=text, tokens=tokens), {"val/acc": 0.5})
    return group


def keep(*args: str) -> None:
    run_script(coda_sentiment.EXPERIMENT, ["keep", "table5", "--smoke", *args])


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_keep_copies_finished_runs_without_the_text(tmp_path, monkeypatch, capsys):
    group = runs(tmp_path, monkeypatch)
    keep("--to", str(tmp_path / "kept"))
    out = capsys.readouterr().out
    kept = tmp_path / "kept" / Path(*GROUP)
    assert sorted(p.name for p in kept.iterdir()) == ["sst-coda-seed0", "sst-transformer-seed0"]
    assert "sst-coda-seed1: not finished (its CSV lacks test/acc): not kept" in out
    run = kept / "sst-coda-seed0"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "hparams.yaml",
                                                     "metrics.csv", "predictions-test.jsonl"]
    written = read(run / "predictions-test.jsonl")
    assert written == rows(text=False)
    assert list(written[0]) == ["id", "tokens", "gold", "prediction", "log_probs"]
    assert (run / "metrics.csv").read_bytes() == \
        (group / "sst-coda-seed0" / "metrics.csv").read_bytes()
    # the source is untouched
    assert read(group / "sst-coda-seed0" / "predictions-test.jsonl") == rows()


def test_kept_counts_slice_as_the_text_does(tmp_path, monkeypatch):
    runs(tmp_path, monkeypatch)
    experiment = coda_sentiment.EXPERIMENT
    grid = experiment.grid("table5")
    from_text = slice_results(experiment, grid, "smoke", experiment.slicings(["length"]))
    keep("--to", str(tmp_path / "kept"))
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "kept"))
    from_counts = slice_results(experiment, grid, "smoke", experiment.slicings(["length"]))
    def shown(results):
        (sst,) = [r for r in results if r.baseline == "sst-transformer"]
        return [(s.name, s.n_baseline, s.baseline, s.proposal) for s in sst.rows]

    assert shown(from_text) == shown(from_counts)
    assert shown(from_counts)[0] == ("Q1: <= 2 tokens", 2, 50.0, 50.0)


def test_kept_before_is_passed_over_and_a_changed_run_refused(tmp_path, monkeypatch, capsys):
    group = runs(tmp_path, monkeypatch)
    keep("--to", str(tmp_path / "kept"))
    capsys.readouterr()
    keep("--to", str(tmp_path / "kept"))
    assert "sst-coda-seed0: kept before (the same metrics.csv in" in capsys.readouterr().out
    metrics = group / "sst-coda-seed0" / "metrics.csv"
    metrics.write_text(metrics.read_text().replace("0,10,", "0,20,"))
    with pytest.raises(SystemExit) as refused:
        keep("--to", str(tmp_path / "kept"))
    assert str(refused.value.code).endswith(
        "1 run(s) kept before differ from the runs in "
        f"{group}: sst-coda-seed0; --force replaces them")
    keep("--to", str(tmp_path / "kept"), "--force")
    kept = tmp_path / "kept" / Path(*GROUP) / "sst-coda-seed0" / "metrics.csv"
    assert kept.read_bytes() == metrics.read_bytes()


def test_tokens_from_data_in_place(tmp_path, monkeypatch, capsys):
    """Runs committed without text or counts get each example's count from the run's test
    set, rewritten where they are; a second pass changes nothing."""
    group = runs(tmp_path, monkeypatch, text=False, tokens=False)
    keep("--to", str(tmp_path / "runs"))  # no counts to be had without --tokens-from-data
    assert "0 per-example file(s) rewritten" in capsys.readouterr().out
    keep("--to", str(tmp_path / "runs"), "--tokens-from-data")
    out = capsys.readouterr().out
    assert out.count("the test set's token counts from tests.experiments.test_keep."
                     "TinyTestSet") == 1  # built once for the runs that share it
    assert "1 per-example file(s) rewritten" in out
    for cell in ("sst-transformer", "sst-coda"):
        written = read(group / f"{cell}-seed0" / "predictions-test.jsonl")
        assert written == rows(text=False)
    assert (group / "sst-coda-seed0" / "checkpoints" / "last.ckpt").exists()  # in place
    keep("--to", str(tmp_path / "runs"), "--tokens-from-data")
    assert "0 per-example file(s) rewritten" in capsys.readouterr().out


def test_text_without_counts_needs_the_data(tmp_path, monkeypatch):
    """A run written before the models counted tokens: its text (decoded words) does not
    give the count, so keep asks for --tokens-from-data, which then gives it."""
    group = runs(tmp_path, monkeypatch, tokens=False)
    path = group / "sst-transformer-seed0" / "predictions-test.jsonl"
    with pytest.raises(SystemExit) as stopped:
        keep("--to", str(tmp_path / "kept"))
    assert str(stopped.value.code) == (
        f"{path}, line 1: an input without 'tokens' (written before the model counted them): "
        "--tokens-from-data takes the counts from the run's test set")
    keep("--to", str(tmp_path / "kept"), "--tokens-from-data")
    kept = tmp_path / "kept" / Path(*GROUP) / "sst-transformer-seed0" / "predictions-test.jsonl"
    assert read(kept) == rows(text=False)


def test_an_id_outside_the_test_set_and_a_count_that_disagrees_stop_it(tmp_path, monkeypatch):
    group = runs(tmp_path, monkeypatch, text=False, tokens=False)
    path = group / "sst-coda-seed0" / "predictions-test.jsonl"
    path.write_text(path.read_text().replace('{"id": 5,', '{"id": 9,'))
    with pytest.raises(SystemExit) as stopped:
        keep("--to", str(tmp_path / "kept"), "--tokens-from-data")
    assert str(stopped.value.code) == (f"{path}, line 6: id 9 is not in the run's test set "
                                       "(6 examples)")
    group = runs(tmp_path / "again", monkeypatch)
    path = group / "sst-coda-seed0" / "predictions-test.jsonl"
    path.write_text(path.read_text().replace('"tokens": 3,', '"tokens": 7,'))
    keep("--to", str(tmp_path / "again" / "kept"))  # nothing to check it against
    with pytest.raises(SystemExit) as stopped:
        keep("--to", str(tmp_path / "again" / "kept"), "--tokens-from-data", "--force")
    assert str(stopped.value.code) == (
        f"{path}, line 3: 'tokens' is 7 but the run's test set gives id 2 3 tokens (its data "
        "or tokenizer is not the run's)")


def test_no_runs_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    with pytest.raises(SystemExit) as none:
        keep("--to", str(tmp_path / "kept"), "--cells", "imdb-coda")
    assert str(none.value.code) == (f"coda_sentiment.py keep: no run of imdb-coda in "
                                    f"{tmp_path / 'coda_sentiment' / 'table5-smoke'}")
