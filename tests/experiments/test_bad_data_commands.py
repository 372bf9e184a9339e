"""Bad data from the commands (issue 16, item 4): the reader's error, whether the vocabulary
link, the fit's ``setup`` or a DataModule's constructor met it, is the command's one line of
error (exit code 1, no traceback; ATTNREPRO_DEBUG=1 shows it with its traceback), after the
warnings the user must see.

The bad files are written here (their valid lines: tests/conftest.py); no test needs
../shared/data."""

from __future__ import annotations

import subprocess
import sys

import pytest

from datamodules.common import DataFormatError
from experiments import dwin_classification
from experiments.harness.errors import data_error_in, unwrapped
from experiments.harness.runner import main as run_script
from tests.conftest import DNLI, LINZEN, ROOT, lines, snli, write_iwslt

UTF16_START = b"\xff\xfe["  # a file saved as UTF-16
pytestmark = pytest.mark.usefixtures("private_cache")


# ----------------------------------------------------------------------------- the commands

LIGHTNING_INFO = ("Seed set to ", "GPU available: ", "TPU available: ", "HPU available: ",
                  "`Trainer(")


def error_lines(stderr: str) -> list[str]:
    """The lines of a command's stderr that are not Lightning's start-up information (the
    seed, the devices, the trainer's limits: printed by every run, before any data is read)
    nor torch's LeafSpec FutureWarning."""
    return [line for line in stderr.strip().splitlines()
            if not line.startswith(LIGHTNING_INFO) and "LeafSpec" not in line
            and not line.lstrip().startswith("warnings.warn(")]


def script(name: str, *args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "experiments" / f"{name}.py"), *args],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_bad_data_is_one_line_from_the_command(env, tmp_path):
    """At the vocabulary link (the model's vocab_size is read from the DataModule while the
    classes are built: jsonargparse wraps what it raises) and at fit's ``setup`` (the
    validation files are first read there): one line naming the file, the line and what
    was expected, exit code 1, no traceback.  Started together, read after."""
    nli = ["fit", "--config", "experiments/configs/coda_nli/smoke.yaml", "--config",
           "experiments/configs/coda_nli/smoke/dnli.yaml"]
    undecodable = tmp_path / "undecodable"
    folder = tmp_path / "folder"
    for d in (undecodable, folder):
        d.mkdir()
        for split in ("train", "dev", "test"):
            (d / f"dialogue_nli_{split}.jsonl").write_text(DNLI)
    (undecodable / "dialogue_nli_train.jsonl").write_bytes(UTF16_START)
    (folder / "dialogue_nli_dev.jsonl").unlink()
    (folder / "dialogue_nli_dev.jsonl").mkdir()
    sva = tmp_path / "sva"
    sva.mkdir()
    (sva / "numpred.train").write_text("")
    (sva / "numpred.val").write_text(lines(*LINZEN))
    iwslt = tmp_path / "iwslt"
    write_iwslt(iwslt, val=("", ""))
    procs = {
        "undecodable": script("coda_nli", *nli, "--data.data_dir", str(undecodable), env=env),
        "folder": script("coda_nli", *nli, "--data.data_dir", str(folder), env=env),
        "empty sva": script(
            "dwin_classification", "fit", "--config",
            "experiments/configs/dwin_classification/smoke.yaml", "--config",
            "experiments/configs/dwin_classification/smoke/sva.yaml", "--data.data_dir", str(sva),
            "--data.train_file", "numpred.train", "--data.val_file", "numpred.val",
            "--data.test_file", "numpred.val", env=env),
        "empty iwslt val": script("coda_mt", "fit", "--config",
                                  "experiments/configs/coda_mt/smoke.yaml", "--data.data_dir",
                                  str(iwslt), "--data.train_prefix", "train", env=env),
    }
    done = {}
    for key, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        done[key] = (proc.returncode, error_lines(err), err)
    expected = {
        "undecodable": f"coda_nli.py: {undecodable / 'dialogue_nli_train.jsonl'}:1: expected "
                       f"UTF-8 text, got {repr(UTF16_START)!r}",
        "folder": f"coda_nli.py: {folder / 'dialogue_nli_dev.jsonl'}: expected a file, not a "
                  "directory",
        "empty sva": f"dwin_classification.py: {sva / 'numpred.train'}: expected at least one "
                     "line 'VBZ|VBP<TAB>prefix'",
        "empty iwslt val": f"coda_mt.py: {iwslt / 'tst2012.en'}: expected at least one of the "
                           f"lines of a parallel corpus (it and {iwslt / 'tst2012.vi'} are "
                           "empty)",
    }
    for key, message in expected.items():
        code, lines_, err = done[key]
        assert (code, lines_) == (1, [message]), (key, err)
        assert "Traceback" not in err, (key, err)


def test_no_gold_label_count_is_on_the_console(env, tmp_path):
    """The count of SNLI pairs without a gold label is a warning the user sees: here a run
    whose test file is a folder shows the train and validation counts, then the error."""
    for split in ("train", "dev"):
        (tmp_path / f"snli_1.0_{split}.jsonl").write_text(lines(snli(), snli("-")))
    (tmp_path / "snli_1.0_test.jsonl").mkdir()
    proc = script("coda_nli", "fit", "--config", "experiments/configs/coda_nli/smoke.yaml",
                  "--config", "experiments/configs/coda_nli/smoke/snli.yaml", "--data.data_dir",
                  str(tmp_path), "--data.train_file", "snli_1.0_train.jsonl", "--data.val_file",
                  "snli_1.0_dev.jsonl", "--data.test_file", "snli_1.0_test.jsonl", env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert error_lines(err) == [
        f"snli train ({tmp_path / 'snli_1.0_train.jsonl'}): 1 pairs; dropped 1 without gold "
        "label, 0 empty",
        f"snli val ({tmp_path / 'snli_1.0_dev.jsonl'}): 1 pairs; dropped 1 without gold label, "
        "0 empty",
        f"coda_nli.py: {tmp_path / 'snli_1.0_test.jsonl'}: expected a file, not a directory"], err


def test_jsonargparse_wrappers_are_taken_off():
    """What the runner prints of an error jsonargparse raised from a constructor's or a
    link's: the innermost message (a data error: that error, printed as the data line)."""
    refused = ValueError("SNLIDataModule: batch_size must be at least 1, got 0")
    try:
        try:
            raise refused
        except ValueError as err:
            raise ValueError("Does not validate against any of the Union subtypes\nSubtypes: "
                             "[...]") from err
    except ValueError as wrapped:
        assert unwrapped(wrapped) is refused and data_error_in(wrapped) is None
    bad = DataFormatError("dev.jsonl", 3, "a JSON object")
    try:
        try:
            raise bad
        except DataFormatError as err:
            raise ValueError("Call to compute_fn of link 'data --> model.vocab_size' with args "
                             "(...) failed: dev.jsonl:3: ...") from err
    except ValueError as wrapped:
        assert data_error_in(wrapped) is bad
    other = ValueError("d_model must be at least 1, got 0")
    assert unwrapped(other) is other and data_error_in(other) is None


def test_debug_shows_the_data_error_with_its_traceback(tmp_path, monkeypatch):
    """ATTNREPRO_DEBUG=1: the reader's error itself, raised from the vocabulary link."""
    monkeypatch.setenv("ATTNREPRO_DEBUG", "1")
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    (tmp_path / "numpred.train").write_text("")
    with pytest.raises(DataFormatError, match=r"numpred\.train: expected at least one line"):
        run_script(dwin_classification.EXPERIMENT, [
            "fit", "--config", "experiments/configs/dwin_classification/smoke.yaml", "--config",
            "experiments/configs/dwin_classification/smoke/sva.yaml", "--data.data_dir",
            str(tmp_path), "--data.train_file", "numpred.train", "--data.val_file",
            "numpred.train", "--data.test_file", "numpred.train"])
