"""Ranking readers and DataModules (WikiQA, TrecQA, Ubuntu Dialogue v2) on the real published
files (../shared/data) and on malformed files written here."""

from __future__ import annotations

import csv
import json
import re
import zipfile

import pytest
import torch

from datamodules.common import DataFormatError
from datamodules.nli import DialogueNLIDataModule, ReadStats
from datamodules.ranking import (
    GroupStats,
    RankingDataModule,
    TrecQADataModule,
    UbuntuDataModule,
    WikiQADataModule,
    read_trecqa,
    read_ubuntu,
    read_wikiqa_filtered,
    read_wikiqa_tsv,
)
from tests.conftest import shared_path

WIKIQA = "wikiqa/filtered"
TRECQA = "trecqa"
WIKIQA_TSV = "samples/wiki_qa__0.1.0/dummy_data"
UBUNTU_TRAIN = "samples/ubuntu_dialogs_corpus__train_2.0.0/dummy_data/train.csv"
UBUNTU_EVAL = "samples/ubuntu_dialogs_corpus__dev_test_2.0.0/dummy_data/{}.csv"
NLI_KEYS = {"premise", "premise_mask", "hypothesis", "hypothesis_mask", "label", "index"}

# (questions, pairs, positives, questions without a negative), counted from the files
WIKIQA_COUNTS = {"train": (873, 8672, 1040, 16), "dev": (126, 1130, 140, 4)}
# (questions, questions with candidates, pairs, positives)
TRECQA_COUNTS = {"TRAIN.xml": (94, 93, 4718, 348), "DEV.xml": (82, 81, 1148, 222)}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))


def group_runs(examples) -> list[list[int]]:
    """The labels of each group, groups in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for e in examples:
        groups.setdefault(e.group, []).append(e.label)
    return list(groups.values())


# ----------------------------------------------------------------------------- WikiQA

def wikiqa_counts(folder) -> tuple[int, int, int, int]:
    """Independent count: questions, pairs, positives, questions without a negative."""
    ids = (folder / "id.txt").read_text().split()
    labels = [int(x) for x in (folder / "sim.txt").read_text().split()]
    by_id: dict[str, list[int]] = {}
    for q, y in zip(ids, labels, strict=True):
        by_id.setdefault(q, []).append(y)
    return len(by_id), len(labels), sum(labels), sum(all(v) for v in by_id.values())


@pytest.mark.parametrize("split", ["train", "dev"])
def test_wikiqa_filtered_counts(split):
    folder = shared_path(WIKIQA) / split
    assert wikiqa_counts(folder) == WIKIQA_COUNTS[split]
    stats, groups = ReadStats(), GroupStats()
    examples = list(read_wikiqa_filtered(folder, stats=stats, groups=groups))
    questions, pairs, positives, _ = WIKIQA_COUNTS[split]
    assert len(examples) == stats.examples == pairs and stats.dropped_empty == 0
    assert groups.questions == questions
    runs = group_runs(examples)
    assert len(runs) == questions and sum(map(sum, runs)) == positives
    assert sorted({e.group for e in examples}) == list(range(questions))
    assert [e.line for e in examples] == list(range(1, pairs + 1))


def test_wikiqa_filtered_first_rows():
    folder = shared_path(WIKIQA)
    train = next(read_wikiqa_filtered(folder / "train"))
    assert train.premise == "how are glacier caves formed ?".split()
    assert train.hypothesis == "a partly submerged glacier cave on perito moreno glacier .".split()
    assert (train.label, train.line, train.group) == (0, 1, 0)
    dev = next(read_wikiqa_filtered(folder / "dev"))
    assert dev.premise == "how big is bmc software in houston , tx".split()
    assert dev.hypothesis[:6] == ["bmc", "software", ",", "inc.", "is", "an"]
    assert (dev.label, dev.line, dev.group) == (0, 1, 0)


def test_wikiqa_datamodule_group_stats_and_batches():
    shared_path(WIKIQA)
    dm = WikiQADataModule(test_folder="dev", batch_size=4)  # the shared data has no test/
    dm.setup()
    assert dm.data_dir == shared_path(WIKIQA) and dm.tokenizer == "whitespace"
    assert dm.num_classes == 2 and dm.label_names == ("negative", "positive")
    for split, folder in (("train", "train"), ("val", "dev"), ("test", "dev")):
        questions, pairs, positives, no_negative = WIKIQA_COUNTS[folder]
        assert dm.group_stats[split] == GroupStats(
            questions=questions, groups=questions, candidates=pairs, positives=positives,
            no_positive=0, no_negative=no_negative)
        assert len(dm.datasets[split]) == dm.read_stats[split].examples == pairs
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == NLI_KEYS | {"group"}
    assert batch["group"].shape == batch["label"].shape == (4,)
    assert batch["group"].dtype == torch.long
    assert torch.equal(batch["group"], dm.datasets["val"].groups[batch["index"]])
    groups = torch.cat([b["group"] for b in dm.val_dataloader()])
    assert sorted(set(groups.tolist())) == list(range(126)) and len(groups) == 1130


def test_wikiqa_tsv_samples_first_rows():
    folder = shared_path(WIKIQA_TSV) / "WikiQACorpus"
    train = list(read_wikiqa_tsv(folder / "WikiQA-train.tsv"))  # spaCy tokens
    assert train[0].premise == ["how", "are", "glacier", "caves", "formed", "?"]
    assert train[0].hypothesis == ("A partly submerged glacier cave on Perito Moreno Glacier ."
                                   .split())
    assert (train[0].label, train[0].line, train[0].group) == (0, 2, 0)
    assert [e.label for e in train] == [0, 0, 0, 1, 0] and {e.group for e in train} == {0}
    assert train[4].hypothesis[-6:] == ["contain", "year", "-", "round", "ice", "."]  # spaCy
    dev = list(read_wikiqa_tsv(folder / "WikiQA-dev.tsv", lowercase=True))
    assert dev[0].premise == "how are epithelial tissues joined together ?".split()
    assert [e.label for e in dev] == [0, 0, 0]
    test = list(read_wikiqa_tsv(folder / "WikiQA-test.tsv", tokenizer="whitespace"))
    assert test[0].premise == "HOW AFRICAN AMERICANS WERE IMMIGRATED TO THE US".split()
    assert len(test) == 2


def test_wikiqa_tsv_datamodule_and_no_positive_filter():
    root = shared_path(WIKIQA_TSV)
    dm = WikiQADataModule(format="tsv", data_dir=str(root), batch_size=2)
    assert dm.tokenizer == "spacy"
    assert dm.path("val") == root / "WikiQACorpus" / "WikiQA-dev.tsv"
    dm.setup()
    assert dm.group_stats["val"].no_positive == 1  # the sample's dev question has no answer
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == NLI_KEYS | {"group"} and batch["group"].tolist() == [0, 0]
    # the standard WikiQA evaluation drops the questions without a correct answer: here all
    with pytest.raises(ValueError, match="no_positive.*dropped all 1 groups"):
        WikiQADataModule(format="tsv", data_dir=str(root), filter_groups="no_positive").setup()
    kept = WikiQADataModule(format="tsv", data_dir=str(root), filter_groups="no_positive",
                            val_file="WikiQA-train.tsv", test_file="WikiQA-train.tsv")
    kept.setup()
    assert kept.group_stats["val"].groups == 1 and kept.group_stats["val"].dropped_groups == 0


def test_wikiqa_prepare_data_fetches_the_official_archive(tmp_path, monkeypatch):
    source = shared_path(WIKIQA_TSV) / "WikiQACorpus"
    archive = tmp_path / "release" / "WikiQACorpus.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as z:
        for split in ("train", "dev", "test"):
            z.write(source / f"WikiQA-{split}.tsv", f"WikiQACorpus/WikiQA-{split}.tsv")
    monkeypatch.setattr(WikiQADataModule, "url", archive.as_uri())
    dm = WikiQADataModule(format="tsv", data_dir=str(tmp_path / "data"), tokenizer="whitespace")
    dm.prepare_data()
    assert dm.path("test") == tmp_path / "data" / "WikiQACorpus" / "WikiQA-test.tsv"
    dm.setup()
    assert dm.group_stats["train"].candidates == 5


# ----------------------------------------------------------------------------- TrecQA

def trecqa_blocks(path) -> list[tuple[int, int]]:
    """Independent count: (positives, negatives) of every <QApairs> block."""
    blocks = path.read_text().split("<QApairs ")[1:]
    return [(b.count("\n<positive>"), b.count("\n<negative>")) for b in blocks]


@pytest.mark.parametrize("name", ["TRAIN.xml", "DEV.xml"])
def test_trecqa_counts(name):
    path = shared_path(TRECQA) / name
    blocks = trecqa_blocks(path)
    questions, with_candidates, pairs, positives = TRECQA_COUNTS[name]
    assert len(blocks) == questions and sum(p + n > 0 for p, n in blocks) == with_candidates
    assert sum(p + n for p, n in blocks) == pairs and sum(p for p, _ in blocks) == positives
    groups = GroupStats()
    examples = list(read_trecqa(path, groups=groups))
    assert groups.questions == questions and len(examples) == pairs
    assert sum(e.label for e in examples) == positives
    assert len(group_runs(examples)) == with_candidates
    assert [sum(r) for r in group_runs(examples)] == [p for p, n in blocks if p + n]


def test_trecqa_first_rows():
    folder = shared_path(TRECQA)
    dev = read_trecqa(folder / "DEV.xml")
    first = next(dev)
    assert first.premise == "What ethnic group / race are Crip members ?".split()
    assert first.hypothesis[:4] == ["Prison", "gangs", "have", "a"]
    assert (first.label, first.line, first.group) == (0, 10, 0)
    train = next(read_trecqa(folder / "TRAIN.xml", lowercase=True))
    assert train.premise[:6] == ["who", "is", "the", "author", "of", "the"]
    assert train.hypothesis[:4] == ["the", "iron", "lady", ";"]
    assert (train.label, train.line) == (1, 10)


def test_trecqa_raw_and_clean_dev():
    folder = shared_path(TRECQA)
    blocks = trecqa_blocks(folder / "DEV.xml")
    clean = [(p, n) for p, n in blocks if p and n]  # the clean version keeps these
    assert (len(blocks), len(clean), sum(p + n for p, n in clean)) == (82, 65, 1117)
    runs = {}
    for version in ("raw", "clean"):
        dm = TrecQADataModule(version=version, train_file="TRAIN.xml", test_file="DEV.xml",
                              batch_size=8)
        dm.setup()
        runs[version] = dm
    raw, cleaned = runs["raw"].group_stats["val"], runs["clean"].group_stats["val"]
    assert raw == GroupStats(questions=82, groups=81, candidates=1148, positives=222,
                             no_positive=3, no_negative=13, empty_groups=1)
    assert cleaned == GroupStats(questions=82, groups=65, candidates=1117, positives=205,
                                 dropped_groups=16, dropped_candidates=31, empty_groups=1)
    assert runs["clean"].group_stats["train"] == runs["raw"].group_stats["train"]  # not train
    assert runs["clean"].filter_groups == "clean" and runs["raw"].filter_groups == "none"
    ds = runs["clean"].datasets["test"]
    assert len(ds) == runs["clean"].read_stats["test"].examples == 1117
    assert ds.groups.unique().tolist() == list(range(65))
    batch = next(iter(runs["clean"].test_dataloader()))
    assert batch["group"].shape == (8,) and set(batch) == NLI_KEYS | {"group"}


def test_trecqa_defaults_and_arguments(tmp_path):
    shared_path(TRECQA)
    dm = TrecQADataModule()
    assert dm.files == {"train": "TRAIN-ALL.xml", "val": "DEV.xml", "test": "TEST.xml"}
    with pytest.raises(FileNotFoundError, match="TRAIN-ALL.xml.*castorini"):
        dm.setup()
    with pytest.raises(ValueError, match="version"):
        TrecQADataModule(version="cleaned")
    with pytest.raises(ValueError, match="filter_groups"):
        TrecQADataModule(version="clean", filter_groups="none")
    assert TrecQADataModule(filter_groups="no_positive").filter_groups == "no_positive"


# ----------------------------------------------------------------------------- Ubuntu

def test_ubuntu_samples_first_rows():
    train_path = shared_path(UBUNTU_TRAIN)
    with open(train_path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    train = list(read_ubuntu(train_path))
    assert [(e.label, e.line, e.group) for e in train] == [(1, 2, 0), (0, 3, 1)]
    assert train[0].premise[:6] == ["i", "think", "we", "could", "import", "the"]
    assert train[0].premise == rows[0][0].split() and "__eou__" in train[0].premise
    assert train[1].hypothesis == "sorri __eou__ i think it be ubuntu relat . __eou__".split()
    for split in ("valid", "test"):
        examples = list(read_ubuntu(shared_path(UBUNTU_EVAL.format(split))))
        assert len(examples) == 10 and {e.group for e in examples} == {0}
        assert [e.label for e in examples] == [1] + [0] * 9  # the ground truth first
        assert examples[0].hypothesis == ["nice", "thank", "!", "__eou__"]
        assert examples[-1].hypothesis == ["#", "ubuntu-offtop", "__eou__"]
        assert examples[0].premise[:4] == ["anyon", "know", "whi", "my"]
        assert all(e.premise is examples[0].premise for e in examples)
    last = list(read_ubuntu(train_path, max_context_tokens=5))
    assert last[0].premise == rows[0][0].split()[-5:]


def test_ubuntu_datamodule_groups_of_ten():
    for name in (UBUNTU_TRAIN, UBUNTU_EVAL.format("valid"), UBUNTU_EVAL.format("test")):
        shared_path(name)
    root = shared_path("samples")
    dm = UbuntuDataModule(data_dir=str(root), train_file=UBUNTU_TRAIN.removeprefix("samples/"),
                          val_file=UBUNTU_EVAL.format("valid").removeprefix("samples/"),
                          test_file=UBUNTU_EVAL.format("test").removeprefix("samples/"),
                          batch_size=4, max_context_tokens=30)
    dm.setup()
    assert dm.group_stats["train"] == GroupStats(questions=2, groups=2, candidates=2,
                                                 positives=1, no_positive=1, no_negative=1)
    assert dm.group_stats["test"] == GroupStats(questions=1, groups=1, candidates=10,
                                                positives=1)
    batches = list(dm.val_dataloader())
    assert all(set(b) == NLI_KEYS | {"group"} for b in batches)
    assert torch.cat([b["group"] for b in batches]).tolist() == [0] * 10
    assert max(b["premise_mask"].sum(1).max() for b in batches) == 30
    index = torch.cat([b["index"] for b in batches])
    labels = torch.cat([b["label"] for b in batches])
    assert labels[index == 0].tolist() == [1] and labels.sum() == 1
    with pytest.raises(ValueError, match="max_context_tokens"):
        UbuntuDataModule(data_dir=str(root), max_context_tokens=0)


# ----------------------------------------------------------------------------- NLI unchanged

def test_nli_batches_have_no_group(tmp_path):
    records = [{"id": str(i), "dtype": "x", "label": label, "sentence1": "i like dogs .",
                "sentence2": "i have a dog ."} for i, label in enumerate(["positive", "negative"])]
    for split in ("train", "dev", "test"):
        (tmp_path / f"dialogue_nli_{split}.jsonl").write_text(json.dumps(records))
    dm = DialogueNLIDataModule(data_dir=str(tmp_path), batch_size=2)
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == NLI_KEYS and dm.datasets["train"].groups is None


# ----------------------------------------------------------------------------- arguments

def test_tokenizer_and_filter_arguments(tmp_path):
    with pytest.raises(ValueError, match="tokenizer must be 'auto', 'whitespace' or 'spacy', "
                                         "got 'parse'"):
        UbuntuDataModule(data_dir=str(tmp_path), tokenizer="parse")
    with pytest.raises(ValueError, match="filter_groups"):
        UbuntuDataModule(data_dir=str(tmp_path), filter_groups="all")
    with pytest.raises(ValueError, match="format"):
        WikiQADataModule(data_dir=str(tmp_path), format="json")
    with pytest.raises(ValueError, match="train_file"):
        WikiQADataModule(data_dir=str(tmp_path), train_file="x.tsv")
    with pytest.raises(ValueError, match="val_folder"):
        WikiQADataModule(data_dir=str(tmp_path), format="tsv", val_folder="dev")
    with pytest.raises(ValueError, match="needs data_dir"):
        WikiQADataModule(format="tsv")  # no shared copy of the official tsv
    assert issubclass(WikiQADataModule, RankingDataModule)


def test_missing_files_say_how_to_get_them(tmp_path):
    dm = WikiQADataModule(data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="castorini"):
        dm.prepare_data()  # no official archive of the filtered version
    (tmp_path / "train").mkdir()
    with pytest.raises(FileNotFoundError, match=r"a\.toks.*castorini"):
        list(read_wikiqa_filtered(tmp_path / "train"))
    tsv = WikiQADataModule(data_dir=str(tmp_path), format="tsv", download=False)
    with pytest.raises(FileNotFoundError, match="WikiQACorpus.zip"):
        tsv.prepare_data()


# ----------------------------------------------------------------------------- written files

def write_filtered(folder, rows: list[tuple[str, str, str, str]]):
    folder.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(("a.toks", "b.toks", "sim.txt", "id.txt")):
        (folder / name).write_text("".join(r[k] + "\n" for r in rows))


FILTERED_ROWS = [("what is x ?", "x is y .", "1", "7"), ("what is x ?", "z .", "0", "7"),
                 ("who is w ?", "w is v .", "0", "3"), ("who is w ?", "v .", "1", "3")]


def test_filtered_empty_pairs_counted_and_groups_renumbered(tmp_path):
    rows = [*FILTERED_ROWS, ("", "empty question", "0", "9"), ("why ?", "", "1", "8")]
    for split in ("train", "dev", "test"):
        write_filtered(tmp_path / split, rows)
    stats = ReadStats()
    examples = list(read_wikiqa_filtered(tmp_path / "dev", stats=stats))
    assert (stats.examples, stats.dropped_empty) == (4, 2)
    assert [e.group for e in examples] == [0, 0, 1, 1]
    dm = WikiQADataModule(data_dir=str(tmp_path), batch_size=2, max_train_examples=3)
    dm.setup()
    assert dm.read_stats["val"].dropped_empty == 2
    assert dm.group_stats["val"] == GroupStats(questions=4, groups=2, candidates=4, positives=2,
                                               empty_groups=2)
    assert dm.datasets["train"].groups.tolist() == [0, 0, 1]  # a prefix of 3 pairs
    assert dm.group_stats["train"].candidates == 3


@pytest.mark.parametrize("name, edit, line", [
    ("sim.txt", lambda text: text.rsplit("\n", 2)[0] + "\n", 4),  # one line short
    ("id.txt", lambda text: text + "5\n", 5),  # one line too many
    ("b.toks", lambda text: text.rsplit("\n", 3)[0] + "\n", 3),
])
def test_filtered_misaligned_files_name_file_and_line(tmp_path, name, edit, line):
    write_filtered(tmp_path, FILTERED_ROWS)
    path = tmp_path / name
    path.write_text(edit(path.read_text()))
    with pytest.raises(DataFormatError, match=rf"{re.escape(str(path))}:{line}: .*line-aligned"):
        list(read_wikiqa_filtered(tmp_path))


def test_filtered_bad_label_and_id(tmp_path):
    write_filtered(tmp_path, [*FILTERED_ROWS[:2], ("q ?", "a .", "2", "4")])
    with pytest.raises(DataFormatError, match=rf"{re.escape(str(tmp_path / 'sim.txt'))}:3: "
                                              r"expected a label 0 \| 1, got \"'2'\""):
        list(read_wikiqa_filtered(tmp_path))
    write_filtered(tmp_path, [*FILTERED_ROWS[:2], ("q ?", "a .", "1", " ")])
    with pytest.raises(DataFormatError, match=r"id\.txt:3: expected a question id"):
        list(read_wikiqa_filtered(tmp_path))


def test_wikiqa_tsv_bad_rows(tmp_path):
    header = "\t".join(["QuestionID", "Question", "DocumentID", "DocumentTitle", "SentenceID",
                        "Sentence", "Label"])
    path = tmp_path / "WikiQA-train.tsv"
    path.write_text("Question\tSentence\tLabel\nq\ts\t1\n")
    with pytest.raises(DataFormatError, match=r"WikiQA-train\.tsv:1: expected the .*header"):
        list(read_wikiqa_tsv(path))
    path.write_text(f"{header}\nQ1\tq ?\tD1\tT\tD1-0\ts .\t1\nQ1\tq ?\tD1\tT\ts .\t0\n")
    with pytest.raises(DataFormatError, match=r"tsv:3: expected 7 tab-separated fields"):
        list(read_wikiqa_tsv(path, tokenizer="whitespace"))
    path.write_text(f"{header}\nQ1\tq ?\tD1\tT\tD1-0\ts .\tyes\n")
    with pytest.raises(DataFormatError, match=r"tsv:2: expected a label 0 \| 1"):
        list(read_wikiqa_tsv(path, tokenizer="whitespace"))


TREC_OK = """<QApairs id='1'>
<question>
Who\tis\tX\t?
WP\tVBZ\tNNP\t.
</question>
<positive>
X\tis\tY\t.
NNP\tVBZ\tNNP\t.
</positive>
<negative>
Z\t.
NN\t.
</negative>
</QApairs>
"""


@pytest.mark.parametrize("text, line, expected", [
    ("<positive>\nX\t.\n</positive>\n" + TREC_OK, 1, "<positive> inside a <QApairs> block"),
    (TREC_OK + "<negative>\nZ\n</negative>\n", 15, "<negative> inside a <QApairs>"),
    (TREC_OK.replace("</positive>\n", ""), 9, "</positive> closing the <positive> of line 6"),
    (TREC_OK.replace("X\tis\tY\t.", ""), 7, "the tab-separated tokens of the <positive>"),
    (TREC_OK.replace("</QApairs>\n", ""), 1, "</QApairs> closing this <QApairs>"),
    (TREC_OK.replace("</negative>\n</QApairs>\n", ""), 10, "</negative> closing this"),
    (TREC_OK + TREC_OK.replace("</QApairs>\n", ""), 15, "</QApairs> closing this"),
    (TREC_OK.replace("</QApairs>", "<QApairs id='2'>"), 14, "</QApairs> closing the <QApairs>"),
    (TREC_OK.replace("<question>\nWho\tis\tX\t?\nWP\tVBZ\tNNP\t.\n</question>\n", ""), 2,
     "the <question> .* before its candidates"),
    (TREC_OK.replace("</question>", "</question>\n<question>\nAgain\n</question>"), 6,
     "one <question>"),
    (TREC_OK.replace("<QApairs id='1'>", "<QApairs id='1'>\nstray text"), 2,
     "a <QApairs>, </QApairs>, <question>, <positive> or <negative> tag"),
])
def test_trecqa_malformed_blocks(tmp_path, text, line, expected):
    path = tmp_path / "DEV.xml"
    path.write_text(text)
    with pytest.raises(DataFormatError, match=rf"{re.escape(str(path))}:{line}: expected "
                                              f"{expected}"):
        list(read_trecqa(path))


def test_trecqa_written_block_reads(tmp_path):
    path = tmp_path / "DEV.xml"
    path.write_text("\n" + TREC_OK + "\n" + TREC_OK.replace("'1'", "'2'"))
    examples = list(read_trecqa(path, tokenizer="spacy"))
    assert [(e.label, e.group, e.line) for e in examples] == [(1, 0, 8), (0, 0, 12),
                                                               (1, 1, 23), (0, 1, 27)]
    assert examples[0].premise == ["Who", "is", "X", "?"]
    assert examples[1].hypothesis == ["Z", "."]


UBUNTU_EVAL_HEADER = ("Context,Ground Truth Utterance," +
                      ",".join(f"Distractor_{i}" for i in range(9)))


@pytest.mark.parametrize("text, line, expected", [
    ('Context,Utterance,Label\n"a , b __eou__",c __eou__,1.0\nx __eou__,y,2\n', 3,
     "a label 0 | 1 | 0.0 | 1.0"),
    ('Context,Utterance,Label\n"a\nb __eou__",c,1\nx,y\n', 4, "3 comma-separated fields"),
    ("Context,Response,Label\nx,y,1\n", 1, "the header Context,Utterance,Label"),
    (UBUNTU_EVAL_HEADER + "\n" + ",".join("abcdefghijk") + "\nx,y\n", 3,
     "11 comma-separated fields"),
    ('Context,Utterance,Label\n"unclosed,y,1\n', 2, "CSV records"),
])
def test_ubuntu_bad_rows(tmp_path, text, line, expected):
    path = tmp_path / "train.csv"
    path.write_text(text)
    with pytest.raises(DataFormatError, match=rf"{re.escape(str(path))}:{line}: expected "
                                              f"{re.escape(expected)}"):
        list(read_ubuntu(path))


def test_ubuntu_written_rows(tmp_path):
    path = tmp_path / "valid.csv"
    path.write_text(UBUNTU_EVAL_HEADER + "\n" + '"a, ""b""\nc __eou__ __eot__",'
                    + ",".join(f"r{i} __eou__" for i in range(10)) + "\n\n"
                    + ",".join(["", *"abcdefghij"]) + "\n")
    stats, groups = ReadStats(), GroupStats()
    examples = list(read_ubuntu(path, lowercase=True, stats=stats, groups=groups))
    assert examples[0].premise == ["a,", '"b"', "c", "__eou__", "__eot__"]
    assert [e.hypothesis[0] for e in examples] == [f"r{i}" for i in range(10)]
    assert {e.line for e in examples} == {2}  # a record's first line
    assert (stats.examples, stats.dropped_empty, groups.questions) == (10, 10, 2)
    train = tmp_path / "train.csv"
    train.write_text("Context,Utterance,Label\nx,y,1\nx,z,0.0\n")
    assert [(e.label, e.group) for e in read_ubuntu(train)] == [(1, 0), (0, 1)]
