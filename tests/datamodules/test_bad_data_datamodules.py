"""Bad data in the DataModules (issue 16, the DataModule part of item 5): what the readers
refuse reaches them as the readers' one error (test_bad_data_readers.py), and what only a
split can show (a split of no labelled pair, one emptied by the filters, a vectors file of
none of the vocabulary's words) is one error naming the file and what was expected.

The bad files are written here (their valid lines: tests/conftest.py); no test needs
../shared/data."""

from __future__ import annotations

import logging

import pytest

from datamodules.common import DataFormatError, Vocab
from datamodules.glove import vocab_vectors
from datamodules.iwslt import IWSLT15DataModule
from datamodules.lm1b import LM1BDataModule
from datamodules.nli import DialogueNLIDataModule, SNLIDataModule
from datamodules.sst import SSTDataModule
from datamodules.sva import SVADataModule
from tests.conftest import DNLI, GLOVE, LINZEN, LM1B, SST_TREES, lines, snli, write_iwslt

pytestmark = pytest.mark.usefixtures("private_cache")


# ----------------------------------------------------------------------------- DataModules:
# what the readers refuse reaches them, and what only a split can show


def test_snli_no_gold_label_is_skipped_counted_and_a_warning(tmp_path, caplog):
    """SNLI's '-' is documented: dropped and counted, at WARNING (the console shows it)."""
    for split in ("train", "dev", "test"):
        (tmp_path / f"snli_1.0_{split}.jsonl").write_text(lines(snli(), snli("-"), snli("-")))
    dm = SNLIDataModule(data_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="datamodules.nli"):
        dm.setup()
    assert dm.dropped_no_gold == {"train": 2, "val": 2, "test": 2}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"snli {split} ({tmp_path / f'snli_1.0_{name}.jsonl'}): 1 pairs; dropped "
                        "2 without gold label, 0 empty"
                        for split, name in (("train", "train"), ("val", "dev"), ("test", "test"))]


def test_nli_files_the_release_does_not_hold_are_named_once(tmp_path):
    """A file of one's own that is missing (the smoke config's SNLI sample as train, val
    and test): named once, where it was looked for, and why no download can give it (was the
    path under the archive's folder three times)."""
    sample = "snli_1.0_dev.first1288.jsonl"
    dm = SNLIDataModule(data_dir=str(tmp_path), train_file=sample, val_file=sample,
                        test_file=sample)
    with pytest.raises(FileNotFoundError) as err:
        dm.prepare_data()
    assert str(err.value) == (
        f"snli files not found: {tmp_path / sample} (nor under {tmp_path / 'snli_1.0'}); they "
        "are not in the release https://nlp.stanford.edu/projects/snli/snli_1.0.zip: put them "
        "there or give their folder with --data.data_dir")


def test_nli_split_of_no_labelled_pair(tmp_path):
    for split in ("train", "dev", "test"):
        (tmp_path / f"snli_1.0_{split}.jsonl").write_text(lines(snli()))
    (tmp_path / "snli_1.0_dev.jsonl").write_text(lines(snli("-")))
    with pytest.raises(DataFormatError) as err:
        SNLIDataModule(data_dir=str(tmp_path)).setup()
    assert str(err.value) == (f"{tmp_path / 'snli_1.0_dev.jsonl'}: expected at least one labelled "
                              "pair (ReadStats(examples=0, dropped_no_gold=1, dropped_empty=0))")


def test_dnli_dev_file_that_is_a_folder(tmp_path):
    for split in ("train", "test"):
        (tmp_path / f"dialogue_nli_{split}.jsonl").write_text(DNLI)
    (tmp_path / "dialogue_nli_dev.jsonl").mkdir()
    with pytest.raises(DataFormatError) as err:
        DialogueNLIDataModule(data_dir=str(tmp_path)).vocab_size  # noqa: B018 (reads the files)
    assert str(err.value) == f"{tmp_path / 'dialogue_nli_dev.jsonl'}: expected a file, not a " \
                             "directory"


@pytest.mark.parametrize("empty", ["numpred.train", "numpred.val"])
def test_sva_empty_split_names_its_file(tmp_path, empty):
    """An empty training file used to be a ValueError without the file, an empty
    validation file a split of 0 examples."""
    for name in ("numpred.train", "numpred.val"):
        (tmp_path / name).write_text("" if name == empty else lines(*LINZEN))
    dm = SVADataModule(data_dir=str(tmp_path), test_file=None)
    with pytest.raises(DataFormatError) as err:
        dm.setup("fit")
    assert str(err.value) == (f"{tmp_path / empty}: expected at least one line "
                              "'VBZ|VBP<TAB>prefix'")


def test_lm1b_empty_heldout_shard(tmp_path):
    train = tmp_path / "training-monolingual.tokenized.shuffled"
    heldout = tmp_path / "heldout-monolingual.tokenized.shuffled"
    train.mkdir()
    heldout.mkdir()
    (train / "news.en-00001-of-00100").write_text(lines(*LM1B))
    (heldout / "news.en.heldout-00001-of-00050").write_text("")
    dm = LM1BDataModule(data_dir=str(tmp_path), max_train_shards=1, min_freq=1)
    with pytest.raises(DataFormatError) as err:
        dm.setup("fit")
    assert str(err.value) == (f"{heldout / 'news.en.heldout-00001-of-00050'}: expected at least "
                              "one sentence (one per line)")


def test_sst_split_left_empty_by_binary_names_its_file(tmp_path):
    """Every training tree neutral: ``binary`` drops them all, which is not a dataset."""
    (tmp_path / "train.txt").write_text(lines("(2 (2 It) (2 is))"))
    (tmp_path / "dev.txt").write_text(lines(*SST_TREES))
    dm = SSTDataModule(data_dir=str(tmp_path), test_file="dev.txt")
    with pytest.raises(DataFormatError) as err:
        dm.setup("fit")
    assert str(err.value) == f"{tmp_path / 'train.txt'}: expected at least one train example"


def test_iwslt_empty_validation_files(tmp_path):
    """An empty validation split was a ValueError at fit's setup, 39 lines of traceback."""
    write_iwslt(tmp_path, val=("", ""))
    dm = IWSLT15DataModule(data_dir=str(tmp_path))
    assert dm.src_vocab_size > 4  # the vocabularies read, as the model link does
    with pytest.raises(DataFormatError) as err:
        dm.setup("fit")
    assert str(err.value) == (f"{tmp_path / 'tst2012.en'}: expected at least one of the lines of "
                              f"a parallel corpus (it and {tmp_path / 'tst2012.vi'} are empty)")


def test_iwslt_missing_vocabulary(tmp_path):
    write_iwslt(tmp_path)
    (tmp_path / "vocab.vi").unlink()
    with pytest.raises(FileNotFoundError) as err:
        IWSLT15DataModule(data_dir=str(tmp_path)).tgt_vocab_size  # noqa: B018
    assert str(err.value) == (
        "IWSLT15DataModule vocabulary file (vocab_prefix='vocab'; the Stanford release calls it "
        "vocab.vi: https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/vocab.vi) not found "
        f"at {tmp_path / 'vocab.vi'}")


def test_translation_split_filtered_to_nothing(tmp_path):
    """Every training pair longer than max_len: the files are fine, the split is empty."""
    write_iwslt(tmp_path)
    dm = IWSLT15DataModule(data_dir=str(tmp_path), max_len=2)
    with pytest.raises(DataFormatError) as err:
        dm.setup("fit")
    assert str(err.value) == (
        f"{tmp_path / 'train.en'}, {tmp_path / 'train.vi'}: expected iwslt15 train pairs left "
        "after the length filters (max_len=2, max_ratio=None), got \"none of 2 ({'read': 2, "
        "'too_long': 2})\"")


def test_glove_without_any_vocabulary_word_is_an_error(tmp_path, caplog):
    """Every row random is not GloVe: an error naming the file and the count.  Some words
    found, but fewer than half: a warning with the count."""
    path = tmp_path / "glove.txt"
    path.write_text(lines("Der 0.1 0.2 0.3", "Film 0.4 0.5 0.6"))
    vocab = Vocab(["the", "film", "good"])
    with pytest.raises(DataFormatError) as err:
        vocab_vectors(path, vocab, dim=3, cache=False)
    assert str(err.value) == (f"{path}: expected vectors for the vocabulary's words (another "
                              "language, casing or tokenization?), got '0 of 3 words found'")
    path.write_text(lines(*GLOVE))  # the, film: 2 of 3
    with caplog.at_level(logging.INFO, logger="datamodules.glove"):
        assert vocab_vectors(path, vocab, dim=3, cache=False).found == 2
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="datamodules.glove"):
        assert vocab_vectors(path, Vocab(["the", "a", "of", "to"]), dim=3, cache=False).found == 1
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"{path.resolve()}: 1 of 4 vocabulary words found, 3 out of vocabulary "
                          "(random N(0, 0.01)); fewer than 50%: is it the right vectors file?")]
