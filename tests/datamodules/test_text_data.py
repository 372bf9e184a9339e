"""SST, IMDb, SVA (Linzen) and One Billion Word: readers on the real shared files (or on
directories written here in the published layouts), malformed input, tokenizers and their
cache, and the DataModules end to end."""

from __future__ import annotations

import os
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

from datamodules.common import DataFormatError
from datamodules.fetch import extract_archive
from datamodules.imdb import IMDbDataModule, carve_validation, read_aclimdb
from datamodules.lm1b import LM1BDataModule, heldout_shard, read_sentences, train_shard
from datamodules.sst import (
    SSTDataModule,
    parse_sst_tree,
    read_glue_sst2,
    read_sst_ptb,
    sst_examples,
)
from datamodules.sva import SVADataModule, read_linzen
from datamodules.text import SPECIALS, build_tokenizer, spacy_tokenize, split_tokens
from tests.conftest import shared_path

ROOT = Path(__file__).resolve().parents[2]

FIRST_TRAIN_TREE = (
    "The Rock is destined to be the 21st Century 's new `` Conan '' and that he 's going to "
    "make a splash even greater than Arnold Schwarzenegger , Jean-Claud Van Damme or Steven "
    "Segal ."
).split(" ")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Tokenizers are cached in a fresh folder per test."""
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))


def assert_names(err: pytest.ExceptionInfo, path: Path, line: int | None) -> None:
    assert err.value.path == str(path) and err.value.line == line
    assert (f"{path}:{line}" if line is not None else str(path)) in str(err.value)


# ---------------------------------------------------------------------------------------
# SST


def test_sst_first_train_tree_parsed_exactly():
    trees = read_sst_ptb(shared_path("sst_ptb/train.txt"))
    assert len(trees) == 8544
    first = trees[0]
    assert list(first.words) == FIRST_TRAIN_TREE and first.label == 3
    line = shared_path("sst_ptb/train.txt").read_text().split("\n")[0]
    assert len(first.spans) == line.count("(")  # one span per node
    assert first.phrases()[1] == (("The", "Rock"), 2)  # "(2 (2 The) (2 Rock))"
    assert first.phrases()[-1] == ((".",), 2)


def test_sst_dev_count_and_binary_neutral_drop():
    dev = shared_path("sst_ptb/dev.txt")
    assert len(read_sst_ptb(dev)) == 1101
    train = shared_path("sst_ptb/train.txt")
    roots = [line[1] for line in train.read_text().splitlines()]  # "(3 ..." -> "3"
    examples, dropped = sst_examples(read_sst_ptb(train), "binary")
    assert dropped == roots.count("2") == 1624
    assert [label for _, label in examples] == [int(r in "34") for r in roots if r != "2"]
    fine, none_dropped = sst_examples(read_sst_ptb(train), "fine")
    assert none_dropped == 0 and [label for _, label in fine] == [int(r) for r in roots]


def test_sst_phrases_and_hand_tree():
    tree = parse_sst_tree("(3 (2 a) (4 (4 good) (2 film)))")
    assert tree.words == ("a", "good", "film") and tree.label == 3
    assert tree.phrases() == [(("a", "good", "film"), 3), (("a",), 2), (("good", "film"), 4),
                              (("good",), 4), (("film",), 2)]
    again = parse_sst_tree("(1 (2 a) (2 film))")  # "a" and "film" repeat: kept once
    fine, _ = sst_examples([tree, again], "fine", phrases=True)
    assert [(" ".join(w), y) for w, y in fine] == [
        ("a good film", 3), ("a", 2), ("good film", 4), ("good", 4), ("film", 2), ("a film", 1)]
    binary, dropped = sst_examples([tree, again], "binary", phrases=True)
    assert dropped == 2 and [(" ".join(w), y) for w, y in binary] == [
        ("a good film", 1), ("good film", 1), ("good", 1), ("a film", 0)]
    # a no-break space inside a word is part of it (train.txt line 4342: "8\xa01/2")
    assert parse_sst_tree("(2 (2 8\xa01\\/2) (2 x))").words == ("8\xa01\\/2", "x")


@pytest.mark.parametrize("tree, expected", [
    ("(3 (2 a) (2 b)", "balanced parentheses (1 '(' left open)"),
    ("(3 (2 a) (2 b)))", "a ')' closes nothing"),
    ("(5 (2 a) (2 b))", "a sentiment label 0-4"),
    ("(x a)", "a sentiment label 0-4"),
    ("(2 a b)", "one word per leaf"),
    ("(2 a (2 b))", "a leaf '(label word)' to hold one word"),
    ("(2 )", "a word or subtrees in every node"),
    ("(2 a) (2 b)", "one tree per line"),
    ("", "a tree"),
])
def test_sst_malformed_tree_names_file_and_line(tmp_path, tree, expected):
    path = tmp_path / "train.txt"
    path.write_text("(3 (2 fine) (3 tree))\n" + tree + "\n")
    with pytest.raises(DataFormatError, match=re.escape(expected)) as err:
        read_sst_ptb(path)
    assert_names(err, path, 2)


def test_glue_sst2_first_rows():
    rows = read_glue_sst2(shared_path("sst2_glue/glue_sst2_train.part90.tsv"))
    assert rows[:2] == [(["when", "are", "bears", "bears", "and"], 1), (["kids", ",", "spirit"], 1)]
    part10 = read_glue_sst2(shared_path("sst2_glue/glue_sst2_train.part10.tsv"))
    assert part10[0] == (["the", "expressive", "power", "of", "the", "camera"], 1)
    assert len(rows) + len(part10) == 67349  # all of GLUE SST-2 train
    dev = read_glue_sst2(shared_path("samples/glue__sst2_1.0.0/dummy_data/SST-2/dev.tsv"))
    assert dev == [("it 's a charming and often affecting journey .".split(" "), 1),
                   (["unflinchingly", "bleak", "and", "desperate"], 0)]
    test = shared_path("samples/glue__sst2_1.0.0/dummy_data/SST-2/test.tsv")
    with pytest.raises(DataFormatError, match="no labels") as err:
        read_glue_sst2(test)  # index \t sentence: GLUE's unlabelled test file
    assert_names(err, test, 1)


@pytest.mark.parametrize("row, expected", [
    ("a sentence\t2", "label 0 or 1"),
    ("a sentence\t1\textra", "2 fields"),
    ("no label", "2 fields"),
    (" \t1", "a non-empty sentence"),
])
def test_glue_bad_row_names_file_and_line(tmp_path, row, expected):
    path = tmp_path / "train.tsv"
    path.write_text(f"sentence\tlabel\ngood film \t1\n{row}\n")
    with pytest.raises(DataFormatError, match=re.escape(expected)) as err:
        read_glue_sst2(path)
    assert_names(err, path, 3)


def test_empty_sst_files_name_the_file(tmp_path):
    for reader, name, expected in [(read_glue_sst2, "train.tsv", "at least one row"),
                                   (read_sst_ptb, "train.txt", "at least one tree")]:
        path = tmp_path / name
        path.write_text("")
        with pytest.raises(DataFormatError, match=rf"{re.escape(str(path))}: expected .*"
                                                  rf"{expected}"):
            reader(path)


# ---------------------------------------------------------------------------------------
# Linzen subject-verb agreement


def test_linzen_first_lines_of_numpred_val():
    path = shared_path("linzen_agreement/numpred.val")
    examples = read_linzen(path)
    assert examples[:5] == [(["since", "NNP", "models"], 1),
                            (["the", "type", "and", "only", "species"], 0),
                            ("the NNS are made of stone , the upper structures".split(" "), 1),
                            ("in practice , though , the word".split(" "), 0),
                            ("so today , those same views".split(" "), 1)]
    lines = path.read_text().splitlines()
    assert len(examples) == len(lines) == 15772
    assert sum(y for _, y in examples) == sum(line.startswith("VBP\t") for line in lines)


@pytest.mark.parametrize("row, expected", [
    ("VBD\tthe dogs", "verb tag VBZ or VBP"),
    ("vbz\tthe dog", "verb tag VBZ or VBP"),
    ("VBZ the dog", "2 fields"),
    ("VBZ\t", "a non-empty prefix"),
])
def test_linzen_bad_line_names_file_and_line(tmp_path, row, expected):
    path = tmp_path / "numpred.val"
    path.write_text(f"VBZ\tthe dog\nVBP\tthe dogs\n{row}\n")
    with pytest.raises(DataFormatError, match=re.escape(expected)) as err:
        read_linzen(path)
    assert_names(err, path, 3)


# ---------------------------------------------------------------------------------------
# IMDb (aclImdb layout written here)

REVIEWS = {  # (split, folder, file name): text
    ("train", "neg", "0_3.txt"): "Dull.<br /><br />I left early.",
    ("train", "neg", "10_1.txt"): "The worst film I have seen.",
    ("train", "neg", "2_4.txt"): "Not good,<BR>not bad.",
    ("train", "pos", "1_10.txt"): "A masterpiece.<br/>Go!",
    ("train", "pos", "3_7.txt"): "Quite  nice\nfilm.",
    ("train", "pos", "12_9.txt"): "I loved it, didn't you?",
    ("train", "unsup", "5_0.txt"): "Unlabelled review.",
    ("test", "neg", "0_2.txt"): "Bad acting.",
    ("test", "pos", "0_8.txt"): "Good acting.",
}


def write_aclimdb(root: Path, reviews: dict = REVIEWS) -> Path:
    for (split, folder, name), text in reviews.items():
        (root / "aclImdb" / split / folder).mkdir(parents=True, exist_ok=True)
        (root / "aclImdb" / split / folder / name).write_text(text)
    (root / "aclImdb" / "imdb.vocab").write_text("the\nand\n")
    (root / "aclImdb" / "train" / "urls_pos.txt").write_text("http://www.imdb.com/title/x\n")
    return root / "aclImdb"


def test_aclimdb_layout_labels_ratings_and_line_breaks(tmp_path):
    root = write_aclimdb(tmp_path)
    train = read_aclimdb(root, "train")
    assert [(r.label, r.rating, r.id) for r in train] == [
        (0, 3, 0), (0, 4, 2), (0, 1, 10), (1, 10, 1), (1, 7, 3), (1, 9, 12)]  # neg, pos by id
    assert train[0].text == "Dull.  I left early." and train[1].text == "Not good, not bad."
    unsup = read_aclimdb(root, "train", folders=("unsup",))
    assert [(r.label, r.rating, r.text) for r in unsup] == [(None, 0, "Unlabelled review.")]
    assert [(r.label, r.rating) for r in read_aclimdb(root, "test")] == [(0, 2), (1, 8)]
    words = list(spacy_tokenize([train[3].text, train[4].text, train[5].text]))
    assert words == [["A", "masterpiece", ".", "Go", "!"], ["Quite", "nice", "film", "."],
                     ["I", "loved", "it", ",", "did", "n't", "you", "?"]]


@pytest.mark.parametrize("folder, name, expected", [
    ("pos", "4_5.txt", "a rating 7-10 in pos/"),
    ("neg", "4_8.txt", "a rating 1-4 in neg/"),
    ("neg", "review.txt", "<id>_<rating>.txt"),
])
def test_aclimdb_bad_file_names_the_file(tmp_path, folder, name, expected):
    root = write_aclimdb(tmp_path, {**REVIEWS, ("train", folder, name): "text"})
    with pytest.raises(DataFormatError, match=re.escape(expected)) as err:
        read_aclimdb(root, "train")
    assert_names(err, root / "train" / folder / name, None)


def test_imdb_validation_carved_by_seeded_fraction(tmp_path):
    train, val = carve_validation(1000, 0.1, seed=0)
    assert len(val) == 100 and sorted(train + val) == list(range(1000))
    assert carve_validation(1000, 0.1, seed=0) == (train, val)
    assert carve_validation(1000, 0.1, seed=1)[1] != val

    root = write_aclimdb(tmp_path)
    dm = IMDbDataModule(data_dir=str(root), val_fraction=1 / 3, tokenization="word", batch_size=2)
    dm.setup("fit")
    assert dm.stats["examples"] == {"train": 4, "val": 2}
    assert sorted(dm.ratings["train"] + dm.ratings["val"]) == [1, 3, 4, 7, 9, 10]
    val_ids = {r.id for r in dm.reviews("val")}
    assert len(val_ids) == 2 and not val_ids & {r.id for r in dm.reviews("train")}
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    check_classification_batch(dm, batch, 2)
    assert batch["label"].tolist() == [0, 1] and batch["mask"].sum(1).tolist() == [3, 3]


# ---------------------------------------------------------------------------------------
# One Billion Word (layout written here)


def write_lm1b(root: Path, train_shards: int = 3) -> Path:
    root = root / "1-billion-word-language-modeling-benchmark-r13output"
    for i in range(1, train_shards + 1):
        path = train_shard(root, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"shard {i} sentence {j} .\n" for j in range(4)))
    for i in range(2):
        path = heldout_shard(root, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"sentence {i} .\n\nshard {i} sentence 0 1 .\n")
    (root / "heldout-monolingual.tokenized.shuffled" / "news.en-00000-of-00100").write_text(
        "not read .\n")
    return root


@pytest.mark.slow
def test_real_aclimdb_counts_labels_ratings_and_no_test_reads_in_training(monkeypatch):
    """The shared aclImdb (../shared/data/imdb/aclImdb, found without flags): 12,500 reviews
    per label in train and in test, labels from the folders and ratings from the file names
    (1-4 negative, 7-10 positive, both ends present); the validation split carved from train
    is the same for the same seed and another for another seed; fitting reads train only."""
    root = shared_path("imdb/aclImdb")
    assert IMDbDataModule().data_dir == root
    for split in ("train", "test"):
        reviews = read_aclimdb(root, split)
        assert len(reviews) == 25_000, split
        by_label = {label: [r for r in reviews if r.label == label] for label in (0, 1)}
        assert [len(by_label[0]), len(by_label[1])] == [12_500, 12_500]
        assert all(r.path.parent.name == "neg" for r in by_label[0])
        assert all(r.path.parent.name == "pos" for r in by_label[1])
        assert {r.rating for r in by_label[0]} == {1, 2, 3, 4}
        assert {r.rating for r in by_label[1]} == {7, 8, 9, 10}
        assert len({r.id for r in by_label[1]}) == 12_500  # ids unique per folder
    splits = [carve_validation(25_000, 0.1, seed) for seed in (0, 0, 1)]
    assert splits[0] == splits[1] and splits[0][1] != splits[2][1]
    train, val = splits[0]
    assert len(val) == 2_500 and not set(train) & set(val) and len(train) + len(val) == 25_000
    read = []
    original = read_aclimdb
    monkeypatch.setattr("datamodules.imdb.read_aclimdb",
                        lambda root, split, *a, **k: read.append(split) or original(root, split,
                                                                                   *a, **k))
    dm = IMDbDataModule(tokenization="word", max_train_examples=200, batch_size=8, max_len=64)
    dm.setup("fit")
    next(iter(dm.train_dataloader())), next(iter(dm.val_dataloader()))
    assert read and set(read) == {"train"}, read
    assert dm.stats["examples"] == {"train": 200, "val": 2_500}


def test_lm1b_layout_shards(tmp_path):
    root = write_lm1b(tmp_path)
    assert train_shard(root, 7).name == "news.en-00007-of-00100"
    assert heldout_shard(root, 0).name == "news.en.heldout-00000-of-00050"
    dm = LM1BDataModule(data_dir=str(root), max_train_shards=2, min_freq=1, batch_size=8)
    assert [p.name for p in dm.split_files("train")] == [
        "news.en-00001-of-00100", "news.en-00002-of-00100"]
    train = [words for words, _ in dm.examples("train")]
    assert [" ".join(w) for w in train] == [f"shard {i} sentence {j} ." for i in (1, 2)
                                            for j in range(4)]
    dm.setup("fit")
    assert dm.stats["examples"] == {"train": 8, "val": 2}
    assert dm.stats["blank_lines"]["val"] == 1
    assert list(read_sentences([heldout_shard(root, 0)]))[1] == []
    with pytest.raises(ValueError, match="1-99"):
        LM1BDataModule(data_dir=str(root), max_train_shards=100)
    with pytest.raises(ValueError, match="0-49"):
        LM1BDataModule(data_dir=str(root), val_shards=(50,))


def test_lm1b_batch_targets_are_inputs_shifted(tmp_path):
    root = write_lm1b(tmp_path)
    dm = LM1BDataModule(data_dir=str(root), max_train_shards=3, min_freq=1, batch_size=4,
                        max_len=6)
    dm.setup("fit")
    assert (dm.pad_id, dm.bos_id, dm.eos_id) == (0, 2, 3)
    batch = next(iter(dm.val_dataloader()))
    tokens, targets, mask = batch["tokens"], batch["targets"], batch["mask"]
    assert tokens.shape == targets.shape == mask.shape and mask.dtype == torch.bool
    assert (tokens[:, 0] == dm.bos_id).all()
    assert torch.equal(tokens[:, 1:][mask[:, 1:]], targets[:, :-1][mask[:, 1:]])
    assert (targets[~mask] == dm.pad_id).all() and (tokens[~mask] == dm.pad_id).all()
    rows = {" ".join(dm.tokenizer.decode(t[m].tolist() + [dm.eos_id]))
            for t, m in zip(targets, mask)}
    # "shard 1 sentence 0 1 ." is 6 words + </s>: cut to max_len=6 targets, no </s>
    assert rows == {"sentence 1 .", "shard 1 sentence 0 1 ."}
    assert mask.sum(1).tolist() == [4, 6]
    ends = [targets[i, m.sum() - 1].item() for i, m in enumerate(mask)]
    assert sorted(e == dm.eos_id for e in ends) == [False, True]
    assert dm.stats["truncated"] == {"train": 0, "val": 1}


# ---------------------------------------------------------------------------------------
# tokenizers


SENTENCES = [s.split(" ") for s in [
    "the film was good", "the film was not good", "a lovely film with lovely performances",
    "it 's a charming and often affecting journey", "the worst film of the year",
    "unflinchingly bleak and desperate", "8\xa01/2 is a film"]]


def test_bpe_trained_cached_and_reloaded_gives_same_ids(tmp_path):
    first = build_tokenizer("bpe", SENTENCES, bpe_vocab_size=80, name="t")
    assert not first.from_cache and first.cache_path.exists()
    assert first.cache_path.parent == tmp_path / "cache"
    again = build_tokenizer("bpe", SENTENCES, bpe_vocab_size=80, name="t")
    assert again.from_cache and again.cache_path == first.cache_path
    probe = [*SENTENCES, ["films", "unseen", "zebra"]]
    assert again.encode_batch(probe) == first.encode_batch(probe)
    assert [first.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3]
    assert first.vocab_size == 80
    assert [first.id_to_token(i) for i in range(4)] == list(SPECIALS)
    assert all(first.token_to_id(first.id_to_token(i)) == i for i in range(80))
    assert first.id_to_token(80) is None
    ids = first.encode(SENTENCES[2])
    assert len(ids) > len(SENTENCES[2]) and first.decode(ids) == SENTENCES[2]
    assert first.decode(first.encode(SENTENCES[6])) == SENTENCES[6]  # the word keeps its \xa0
    assert first.decode([*first.encode(["good"]), first.eos_id, *first.encode(["bad"])]) == ["good"]
    other = build_tokenizer("bpe", SENTENCES, bpe_vocab_size=60, name="t")
    assert not other.from_cache and other.cache_path != first.cache_path
    changed = build_tokenizer("bpe", SENTENCES[:-1], bpe_vocab_size=80, name="t")
    assert not changed.from_cache  # other training words, other key


def test_bpe_ids_do_not_depend_on_the_process(tmp_path):
    """HF's trainer numbers the word-final symbols (``e</w>``) in a per-process hash order;
    canonical_ids numbers the specials, the sorted symbols, then the merges' results in
    merge order: a trained vocabulary with its ids shuffled comes back to the same ids and
    segments every word into the same pieces, and the symbols' ids agree between two
    processes (they did not before: the first symbol ids of two trainings differed)."""
    import json
    import random
    import subprocess
    import sys

    from tokenizers import Tokenizer

    from datamodules.text import canonical_ids

    first = build_tokenizer("bpe", SENTENCES, bpe_vocab_size=80, name="t").tokenizer
    data = json.loads(first.to_str())
    tokens = sorted(data["model"]["vocab"], key=data["model"]["vocab"].get)
    shuffled = tokens[4:]
    random.Random(0).shuffle(shuffled)
    data["model"]["vocab"] = {t: i for i, t in enumerate([*tokens[:4], *shuffled])}
    renumbered = Tokenizer.from_str(json.dumps(data))
    assert renumbered.get_vocab() != first.get_vocab()
    assert canonical_ids(renumbered).get_vocab() == first.get_vocab()
    words = [w for s in SENTENCES for w in s] + ["films", "unseen", "zebra"]
    pieces = [e.tokens for e in renumbered.encode_batch([[w] for w in words],
                                                        is_pretokenized=True,
                                                        add_special_tokens=False)]
    assert pieces == [e.tokens for e in first.encode_batch([[w] for w in words],
                                                           is_pretokenized=True,
                                                           add_special_tokens=False)]
    vocab = first.get_vocab()
    merged = {a + b for a, b in json.loads(first.to_str())["model"]["merges"]}
    symbols = sorted(t for t in vocab if t not in merged and t not in SPECIALS)
    assert [vocab[t] for t in symbols] == list(range(4, 4 + len(symbols)))
    code = ("import json; from datamodules.text import build_tokenizer; "
            "from tests.datamodules.test_text_data import SENTENCES; "
            "t = build_tokenizer('bpe', SENTENCES, bpe_vocab_size=80, name='t').tokenizer; "
            "m = json.loads(t.to_str())['model']; made = {a + b for a, b in m['merges']}; "
            "print(json.dumps({k: v for k, v in m['vocab'].items() if k not in made}))")
    seen = []
    for k in range(2):
        env = {**os.environ, "ATTNREPRO_CACHE": str(tmp_path / f"process{k}")}
        seen.append(json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                              capture_output=True, text=True,
                                              cwd=ROOT).stdout))
    assert seen[0] == seen[1] and len(seen[0]) == 4 + len(symbols)


def test_word_vocab_min_freq_max_size_cached():
    words = build_tokenizer("word", SENTENCES, min_freq=2, name="t")
    # counts: film 5, the 4, a 3, good 2, was 2, lovely 2, and 2, is 1, ...
    assert words.vocab.itos[:4] == list(SPECIALS)
    assert words.vocab.itos[4:] == ["film", "the", "a", "was", "good", "lovely", "and"]
    assert words.encode(["the", "zebra"]) == [words.token_to_id("the"), words.unk_id]
    assert [words.id_to_token(i) for i in (4, 5)] == ["film", "the"]
    assert words.id_to_token(-1) is None and words.id_to_token(words.vocab_size) is None
    assert build_tokenizer("word", SENTENCES, min_freq=2, name="t").from_cache
    capped = build_tokenizer("word", SENTENCES, max_size=3, name="t")
    assert capped.vocab_size == 4 + 3 and not capped.from_cache
    with pytest.raises(ValueError, match="no training sequences"):
        build_tokenizer("word", [], name="t")


def test_split_tokens_and_spacy():
    assert split_tokens(" a  b\xa0c ") == ["a", "b\xa0c"]
    assert list(spacy_tokenize(["I didn't  like it.\n\nNo."])) == [
        ["I", "did", "n't", "like", "it", ".", "No", "."]]


# ---------------------------------------------------------------------------------------
# DataModules end to end


def check_classification_batch(dm, batch, num_classes: int) -> None:
    tokens, mask, label = batch["tokens"], batch["mask"], batch["label"]
    assert tokens.dtype == label.dtype == torch.long and mask.dtype == torch.bool
    assert tokens.shape == mask.shape and label.shape == (tokens.shape[0],)
    assert torch.equal(mask, tokens != dm.pad_id)  # no pad id inside a sequence
    assert mask[:, 0].all() and mask.any(0).all()  # no empty rows, no all-pad column
    assert ((0 <= label) & (label < num_classes)).all()
    assert tokens.max() < dm.vocab_size


def test_sst_datamodule_end_to_end():
    shared_path("sst_ptb/train.txt")
    dm = SSTDataModule(batch_size=16, max_len=20, seed=3)
    assert dm.num_classes == 2 and dm.pad_id == 0
    dm.setup("fit")
    assert dm.stats["examples"] == {"train": 6920, "val": 872}
    assert dm.stats["dropped_neutral"] == {"train": 1624, "val": 229}
    dev = [w for w, _ in sst_examples(read_sst_ptb(shared_path("sst_ptb/dev.txt")))[0]]
    assert dm.stats["truncated"]["val"] == sum(len(w) > 20 for w in dev)
    batch = next(iter(dm.train_dataloader()))
    check_classification_batch(dm, batch, 2)
    assert batch["tokens"].shape[0] == 16 and batch["tokens"].shape[1] <= 20
    val = next(iter(dm.val_dataloader()))  # eval order is deterministic (by length)
    assert torch.equal(val["tokens"], next(iter(dm.val_dataloader()))["tokens"])
    fine = SSTDataModule(granularity="fine", tokenization="bpe", bpe_vocab_size=500,
                         max_train_examples=300)
    fine.setup("fit")
    assert fine.num_classes == 5 and fine.vocab_size == 500
    assert fine.stats["examples"]["train"] == 300
    check_classification_batch(fine, next(iter(fine.train_dataloader())), 5)
    with pytest.raises(ValueError, match="format='ptb'"):
        SSTDataModule(format="glue", granularity="fine")


def test_sst_glue_datamodule_uses_the_shared_parts():
    shared_path("sst2_glue/glue_sst2_train.part90.tsv")
    dm = SSTDataModule(format="glue", max_train_examples=500)
    assert [p.name for p in dm.split_files("train") + dm.split_files("val")] == [
        "glue_sst2_train.part90.tsv", "glue_sst2_train.part10.tsv"]
    dm.setup("fit")
    assert dm.stats["examples"] == {"train": 500, "val": 6735}
    check_classification_batch(dm, next(iter(dm.train_dataloader())), 2)


def test_sva_datamodule_and_missing_train_file():
    shared_path("linzen_agreement/numpred.val")
    dm = SVADataModule(train_file="numpred.val", val_file="numpred.test.5",
                       test_file="numpred.test.4", max_train_examples=2000, batch_size=8)
    dm.setup("fit")
    dm.setup("test")
    assert dm.stats["examples"] == {"train": 2000, "val": 159, "test": 561}
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        check_classification_batch(dm, next(iter(loader)), 2)
    with pytest.raises(FileNotFoundError, match=r"numpred\.train.*numpred\.val"):
        SVADataModule().setup("fit")  # names the missing file and what the folder has


def test_prepare_data_unpacks_the_official_archive(tmp_path, monkeypatch):
    source = write_aclimdb(tmp_path / "src")
    archive = tmp_path / "aclImdb_v1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="aclImdb")
    fetched = []

    def fake_fetch(url, dest, *args, **kwargs):
        fetched.append((url, Path(dest).name))
        return archive

    monkeypatch.setattr("datamodules.fetch.download_file", fake_fetch)
    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "no-shared-data"))
    dm = IMDbDataModule(tokenization="word", val_fraction=0.0)
    # the data root's imdb/aclImdb (as in ../shared/data), not the cache
    assert dm.data_dir == tmp_path / "no-shared-data" / "imdb" / "aclImdb"
    with pytest.raises(FileNotFoundError, match="aclImdb_v1.tar.gz"):
        dm.setup("fit")
    dm.prepare_data()
    assert fetched == [(IMDbDataModule.archive_url, "aclImdb_v1.tar.gz")]
    dm.setup("fit")
    assert dm.stats["examples"] == {"train": 6}
    assert dm.val_dataloader() == []  # val_fraction 0: no validation
    dm.prepare_data()  # files present: nothing fetched
    assert len(fetched) == 1


def test_prepare_data_unpacks_a_zip_and_refuses_members_outside(tmp_path, monkeypatch):
    archive = tmp_path / "trainDevTestTrees_PTB.zip"
    with zipfile.ZipFile(archive, "w") as z:  # the layout of the official SST zip
        z.writestr("trees/train.txt", "(3 (2 a) (4 (4 good) (2 film)))\n(0 (0 awful))\n")
        z.writestr("trees/dev.txt", "(1 (1 bad))\n")
        z.writestr("trees/test.txt", "(4 (4 great))\n")
    monkeypatch.setattr("datamodules.fetch.download_file", lambda url, dest, *a, **k: archive)
    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "no-shared-data"))
    dm = SSTDataModule(granularity="fine")
    dm.prepare_data()
    assert dm.data_dir == tmp_path / "no-shared-data" / "sst_ptb"  # the data root, not the cache
    dm.setup()
    assert dm.stats["examples"] == {"train": 2, "val": 1, "test": 1}
    assert next(iter(dm.test_dataloader()))["label"].tolist() == [4]

    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../outside.txt", "x")
    with pytest.raises(ValueError, match="would leave"):
        extract_archive(evil, tmp_path / "unpacked")
    assert not (tmp_path / "outside.txt").exists()


def test_datamodules_parse_as_lightning_cli_arguments():
    from jsonargparse import ArgumentParser

    for cls in (SSTDataModule, IMDbDataModule, SVADataModule, LM1BDataModule):
        parser = ArgumentParser()
        parser.add_class_arguments(cls, "data")
        cfg = parser.parse_args(["--data.tokenization", "bpe", "--data.max_len", "64"])
        assert cfg.data.tokenization == "bpe" and cfg.data.max_len == 64
    parser = ArgumentParser()
    parser.add_class_arguments(LM1BDataModule, "data")
    assert parser.parse_args(["--data.val_shards", "[1, 2]"]).data.val_shards == (1, 2)
