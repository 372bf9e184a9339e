"""Sizes below 1 (issue 16, the DataModule part of item 5): every DataModule's constructor
refuses a size below its least, naming the argument and the value, and the commands print
it as one line of invalid configuration."""

from __future__ import annotations

import pytest

from datamodules.algolisp import AlgoLispDataModule
from datamodules.imdb import IMDbDataModule
from datamodules.iwslt import IWSLT15DataModule
from datamodules.lm1b import LM1BDataModule
from datamodules.mlu import MLUDataModule
from datamodules.nli import (
    DialogueNLIDataModule,
    MultiNLIDataModule,
    SciTailDataModule,
    SNLIDataModule,
)
from datamodules.ranking import TrecQADataModule, UbuntuDataModule, WikiQADataModule
from datamodules.sst import SSTDataModule
from datamodules.sva import SVADataModule
from datamodules.wmt import WMT14DataModule, WMT16EnRoDataModule
from experiments import coda_mt, coda_nli, coda_ranking, dwin_classification
from tests.conftest import ROOT
from tests.experiments.test_cli import error

DEBUG_HINT = " (ATTNREPRO_DEBUG=1 shows the traceback)"
pytestmark = pytest.mark.usefixtures("private_cache")


# ----------------------------------------------------------------------------- sizes below 1

NLI_SIZES = {"batch_size": 1, "max_train_examples": 1, "min_freq": 1, "vectors_dim": 1,
             "num_workers": 0}
TEXT_SIZES = {"batch_size": 1, "max_len": 1, "max_train_examples": 1, "min_freq": 1,
              "max_vocab_size": 1, "bpe_vocab_size": 5, "num_workers": 0}
TRANSLATION_SIZES = {"batch_size": 1, "eval_batch_size": 1, "train_size": 1, "max_len": 0,
                     "num_workers": 0}
WMT_SIZES = {**TRANSLATION_SIZES, "split_test_for_training": 1, "bpe_vocab_size": 5}
SIZES = [
    (SNLIDataModule, NLI_SIZES), (MultiNLIDataModule, NLI_SIZES), (SciTailDataModule, NLI_SIZES),
    (DialogueNLIDataModule, NLI_SIZES), (WikiQADataModule, NLI_SIZES),
    (TrecQADataModule, NLI_SIZES), (UbuntuDataModule, {**NLI_SIZES, "max_context_tokens": 1}),
    (SSTDataModule, TEXT_SIZES), (IMDbDataModule, TEXT_SIZES), (SVADataModule, TEXT_SIZES),
    (LM1BDataModule, TEXT_SIZES), (IWSLT15DataModule, TRANSLATION_SIZES),
    (AlgoLispDataModule, TRANSLATION_SIZES), (WMT14DataModule, WMT_SIZES),
    (WMT16EnRoDataModule, {**WMT_SIZES, "bpe_merges": 1}),
    (MLUDataModule, {"batch_size": 1, "eval_batch_size": 1, "num_workers": 0}),
]


@pytest.mark.parametrize("cls, arg, least", [(cls, arg, least) for cls, sizes in SIZES
                                             for arg, least in sizes.items()],
                         ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_a_size_below_its_least_is_refused_when_built(cls, arg, least, tmp_path):
    """Before: --data.batch_size 0 passed until the first batch was drawn (68 lines of
    traceback from the sampler); now the constructor names the argument and the value."""
    kwargs = {} if cls is MLUDataModule else {"data_dir": str(tmp_path)}
    hint = " (0 or None: no limit)" if (arg, least) == ("max_len", 0) else ""
    for value in (least - 1, -5):
        with pytest.raises(ValueError) as err:
            cls(**kwargs, **{arg: value})
        assert str(err.value) == f"{cls.__name__}: {arg} must be at least {least}{hint}, got " \
                                 f"{value}"
    cls(**kwargs, **{arg: least})  # the least is allowed


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_mlu_sizes_say_a_file_may_stand_in(split):
    with pytest.raises(ValueError) as err:
        MLUDataModule(**{f"{split}_size": 0})
    assert str(err.value) == (f"MLUDataModule: {split}_size must be at least 1 (or give "
                              f"{split}_file), got 0")
    MLUDataModule(**{f"{split}_size": 0, f"{split}_file": "problems.txt"})


@pytest.mark.parametrize("experiment, configs, cls", [
    (coda_nli, ["coda_nli/smoke.yaml", "coda_nli/smoke/snli.yaml"], "SNLIDataModule"),
    (coda_ranking, ["coda_ranking/smoke.yaml", "coda_ranking/smoke/trecqa.yaml"],
     "TrecQADataModule"),
    (dwin_classification, ["dwin_classification/smoke.yaml",
                           "dwin_classification/smoke/sst.yaml"], "SSTDataModule"),
    (coda_mt, ["coda_mt/smoke.yaml"], "IWSLT15DataModule"),
], ids=lambda v: v.EXPERIMENT.name if hasattr(v, "EXPERIMENT") else None)
def test_batch_size_0_is_one_line_of_invalid_configuration(experiment, configs, cls, tmp_path,
                                                          monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    args = ["fit", *(a for c in configs for a in ("--config", f"experiments/configs/{c}")),
            "--data.batch_size", "0"]
    name = experiment.EXPERIMENT.name
    assert error(experiment.EXPERIMENT, args) == (
        f"{name}.py: invalid configuration: {cls}: batch_size must be at least 1, got 0"
        f"{DEBUG_HINT}")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("**/*.ckpt"))
