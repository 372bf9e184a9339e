"""NLI readers and DataModules on the real published files (../shared/data) and on files in
the published layouts written here (Dialogue NLI, malformed inputs)."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from datamodules.common import PAD, DataFormatError, Vocab
from datamodules.nli import (
    DNLI_LABELS,
    SCITAIL_SNLI_LABELS,
    DialogueNLIDataModule,
    MultiNLIDataModule,
    ReadStats,
    SciTailDataModule,
    SNLIDataModule,
    parse_tokens,
    read_dialogue_nli,
    read_nli,
    read_nli_jsonl,
    read_nli_txt,
    read_scitail_tsv,
)
from tests.conftest import shared_path

SNLI_DEV = "snli/snli_1.0_dev.first1288.jsonl"
SNLI_TXT = "samples/snli__plain_text_1.0.0/dummy_data/snli_1.0"
MNLI = "samples/multi_nli__0.0.0/dummy_data/multinli_1.0.zip/multinli_1.0"
GLUE_MNLI = "samples/glue__mnli_1.0.0/dummy_data/MNLI"
SCITAIL = "samples/scitail__{0}_format_1.1.0/dummy_data/SciTailV1.1/{0}_format"

FIRST_SNLI_PREMISE = "Two women are embracing while holding to go packages .".split()
FIRST_SNLI_HYPOTHESIS = ("The sisters are hugging goodbye while holding to go packages "
                         "after just eating lunch .").split()


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- real files

def test_first_snli_dev_pair_parse_and_spacy_tokens():
    path = shared_path(SNLI_DEV)
    first = next(read_nli_jsonl(path))
    assert first.premise == FIRST_SNLI_PREMISE
    assert first.hypothesis == FIRST_SNLI_HYPOTHESIS
    assert (first.label, first.line) == (1, 1)  # neutral
    spacy = next(read_nli_jsonl(path, tokenizer="spacy", lowercase=True))
    assert spacy.premise == "two women are embracing while holding to go packages .".split()
    assert spacy.hypothesis[:3] == ["the", "sisters", "are"]


def test_snli_no_gold_pairs_dropped_and_counted():
    path = shared_path(SNLI_DEV)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    no_gold = sum(r["gold_label"] == "-" for r in records)
    stats = ReadStats()
    examples = list(read_nli_jsonl(path, stats=stats))
    assert no_gold > 0
    assert stats.dropped_no_gold == no_gold
    assert len(examples) == stats.examples == len(records) - no_gold
    kept = [r for r in records if r["gold_label"] != "-"]
    order = ["entailment", "neutral", "contradiction"]
    assert [e.label for e in examples] == [order.index(r["gold_label"]) for r in kept]
    assert [e.line for e in examples] == [i + 1 for i, r in enumerate(records)
                                         if r["gold_label"] != "-"]


def test_snli_txt_first_lines():
    dev = list(read_nli_txt(shared_path(SNLI_TXT) / "snli_1.0_dev.txt"))
    assert dev[0].premise == FIRST_SNLI_PREMISE and dev[0].hypothesis == FIRST_SNLI_HYPOTHESIS
    assert (dev[0].label, dev[0].line) == (1, 2)  # line 1 is the header
    assert dev[1].hypothesis == "Two woman are holding packages .".split()
    assert dev[1].label == 0
    # the train file's rows have only label1: 10 of the header's 14 columns
    train = list(read_nli_txt(shared_path(SNLI_TXT) / "snli_1.0_train.txt"))
    assert [e.label for e in train] == [1, 2, 0]
    assert train[1].hypothesis == "A person is at a diner , ordering an omelette .".split()


def test_multinli_first_lines_and_jsonl_txt_agree():
    folder = shared_path(MNLI)
    first = next(read_nli_jsonl(folder / "multinli_1.0_train.jsonl"))
    assert first.premise == ("Conceptually cream skimming has two basic dimensions - product "
                             "and geography .").split()
    assert first.hypothesis == "Product and geography are what make cream skimming work .".split()
    assert first.label == 1
    for split in ("train", "dev_matched", "dev_mismatched"):
        jsonl = list(read_nli_jsonl(folder / f"multinli_1.0_{split}.jsonl"))
        txt = list(read_nli_txt(folder / f"multinli_1.0_{split}.txt"))
        assert len(txt) >= 4
        assert [e[:3] for e in txt] == [e[:3] for e in jsonl[:len(txt)]], split
    mismatched = next(read_nli_jsonl(folder / "multinli_1.0_dev_mismatched.jsonl"))
    assert mismatched.label == 2 and "students" in mismatched.hypothesis


def test_glue_mnli_tsv_read_by_header():
    dev = list(read_nli_txt(shared_path(GLUE_MNLI) / "dev_matched.tsv"))
    assert dev[0].premise == "The new rights are nice enough".split()
    assert dev[0].hypothesis == "Everyone really likes the newest benefits".split()
    assert [e.label for e in dev] == [1, 2]
    with pytest.raises(DataFormatError, match=r"test_matched.tsv:1: expected .*gold_label"):
        list(read_nli_txt(shared_path(GLUE_MNLI) / "test_matched.tsv"))


def test_scitail_tsv_and_snli_format_first_lines():
    tsv = list(read_scitail_tsv(shared_path(SCITAIL.format("tsv")) / "scitail_1.0_train.tsv"))
    assert tsv[0].premise[:6] == ["An", "introduction", "to", "atoms", "and", "elements"]
    assert tsv[0].premise.count(",") == 3 and tsv[0].premise[-1] == "."
    assert tsv[0].hypothesis == ("Replace another in a molecule happens to atoms during a "
                                 "substitution reaction .").split()
    assert [e.label for e in tsv] == [1, 0, 0, 1, 1, 0]  # neutral, entails, ...
    assert tsv[2].hypothesis == "Humans typically have 23 pairs pairs of chromosomes .".split()
    snli = list(read_nli_jsonl(shared_path(SCITAIL.format("snli")) / "scitail_1.0_train.txt",
                               SCITAIL_SNLI_LABELS))
    assert [e[:3] for e in snli] == [e[:3] for e in tsv[:len(snli)]]


# ----------------------------------------------------------------------------- malformed

SNLI_RECORD = {"gold_label": "neutral", "sentence1": "A b.", "sentence2": "C d.",
               "sentence1_binary_parse": "( A ( b . ) )", "sentence2_binary_parse": "( C d . )"}


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


@pytest.mark.parametrize("bad, message", [
    ('{"gold_label": "neutral", ', "invalid JSON"),
    ({k: v for k, v in SNLI_RECORD.items() if k != "sentence2_binary_parse"},
     "sentence2_binary_parse=None"),
    ({**SNLI_RECORD, "gold_label": "contradicts"}, "'contradicts'"),
    ('["not", "an", "object"]', r"expected a JSON object.*got '\[\"not\""),
])
def test_jsonl_errors_name_file_and_line(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [SNLI_RECORD, "", SNLI_RECORD, bad])
    with pytest.raises(DataFormatError, match=message) as err:
        list(read_nli_jsonl(path))
    assert err.value.line == 4 and err.value.path == str(path)
    assert str(err.value).startswith(f"{path}:4: expected ")


def test_txt_errors_name_file_and_line(tmp_path):
    header = "gold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1\tsentence2"
    good = "neutral\t( A b )\t( C d )\tA b\tC d"
    path = tmp_path / "bad.txt"
    path.write_text("\n".join([header, good, "neutral\t( A b )"]) + "\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:3: expected 3 to 5 tab-separated"):
        list(read_nli_txt(path))
    path.write_text("\n".join([header, good, good + "\textra"]) + "\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:3: .*got '6 fields'"):
        list(read_nli_txt(path))
    # spaCy tokens need the sentence columns (4 and 5), the parse tokens only columns 1-3
    path.write_text("\n".join([header, good, "neutral\t( A b )\t( C d )"]) + "\n")
    assert len(list(read_nli_txt(path))) == 2
    with pytest.raises(DataFormatError, match=r"bad.txt:3: expected 5 to 5 tab-separated"):
        list(read_nli_txt(path, tokenizer="spacy"))
    path.write_text("\n".join([header, good, good.replace("neutral", "unsure")]) + "\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:3: expected a label in .*'unsure'"):
        list(read_nli_txt(path))
    path.write_text("\n".join([header.replace("gold_label", "label"), good]) + "\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:1: expected a tab-separated header"):
        list(read_nli_txt(path))


def test_scitail_tsv_errors(tmp_path):
    path = tmp_path / "scitail.tsv"
    path.write_text("A b.\tC d.\tentails\nA b.\tC d.\n")
    with pytest.raises(DataFormatError, match=r"scitail.tsv:2: expected 3 tab-separated"):
        list(read_scitail_tsv(path))
    path.write_text("A b.\tC d.\tentails\nA b.\tC d.\tcontradiction\n")
    with pytest.raises(DataFormatError, match=r"scitail.tsv:2: .*'contradiction'"):
        list(read_scitail_tsv(path))


def test_empty_sentence_dropped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl",
                       [SNLI_RECORD, {**SNLI_RECORD, "sentence2_binary_parse": "( )"}])
    stats = ReadStats()
    assert len(list(read_nli_jsonl(path, stats=stats))) == 1
    assert (stats.examples, stats.dropped_empty, stats.dropped_no_gold) == (1, 1, 0)


def test_both_snli_formats_drop_and_count_no_gold_alike(tmp_path):
    records = [SNLI_RECORD, {**SNLI_RECORD, "gold_label": "-"},
               {**SNLI_RECORD, "gold_label": "entailment"}]
    jsonl = write_jsonl(tmp_path / "pairs.jsonl", records)
    txt = tmp_path / "pairs.txt"
    txt.write_text("".join("\t".join(r) + "\n" for r in [list(SNLI_RECORD)]
                           + [list(r.values()) for r in records]))
    for path, format, first in ((jsonl, "jsonl", 1), (txt, "txt", 2)):  # txt: a header
        stats = ReadStats()
        examples = list(read_nli(path, format, stats=stats))
        assert [(e.label, e.line) for e in examples] == [(1, first), (0, first + 2)], format
        assert examples[0][:2] == (["A", "b", "."], ["C", "d", "."])
        assert (stats.examples, stats.dropped_no_gold, stats.dropped_empty) == (2, 1, 0)
    with pytest.raises(ValueError, match="NLI format must be 'jsonl' or 'txt', got 'tsv'"):
        list(read_nli(txt, "tsv"))


def test_snli_and_multinli_published_file_names_by_format(tmp_path):
    snli = SNLIDataModule(data_dir=str(tmp_path), format="txt", val_file="dev.first.txt")
    assert snli.files == {"train": "snli_1.0_train.txt", "val": "dev.first.txt",
                          "test": "snli_1.0_test.txt"}
    mnli = MultiNLIDataModule(data_dir=str(tmp_path))
    assert mnli.files == {"train": "multinli_1.0_train.jsonl",
                          "matched": "multinli_1.0_dev_matched.jsonl",
                          "mismatched": "multinli_1.0_dev_mismatched.jsonl"}
    with pytest.raises(ValueError, match="MultiNLI format must be 'jsonl' or 'txt', got 'tsv'"):
        MultiNLIDataModule(data_dir=str(tmp_path), format="tsv")


def test_parse_tokens_drop_only_brackets():
    assert parse_tokens("( ( -LRB- a ) ( `` b '' ) )") == ["-LRB-", "a", "``", "b", "''"]


# ----------------------------------------------------------------------------- Dialogue NLI

DNLI_RECORDS = [
    {"id": "r1", "dtype": "matchingtriple_up", "label": "positive",
     "sentence1": "i have two dogs .", "sentence2": "i own 2 dogs .",
     "triple1": ["i", "have_pet", "dog"], "triple2": ["i", "have_pet", "dog"]},
    {"id": "r2", "dtype": "negation", "label": "negative",
     "sentence1": "i love to swim.", "sentence2": "i don't like swimming.",
     "triple1": ["i", "like_activity", "swimming"], "triple2": ["i", "dislike", "swimming"]},
    {"id": "r3", "dtype": "misc", "label": "neutral",
     "sentence1": "my favorite color is blue .", "sentence2": "i work at a bank .",
     "triple1": ["i", "favorite_color", "blue"], "triple2": ["i", "has_profession", "banker"]},
]


def test_dialogue_nli_published_layout(tmp_path):
    path = tmp_path / "dialogue_nli_train.jsonl"
    path.write_text(json.dumps(DNLI_RECORDS))  # one JSON list on one line
    examples = list(read_dialogue_nli(path))
    assert [e.label for e in examples] == [0, 2, 1]  # entailment, contradiction, neutral
    assert examples[1].hypothesis == ["i", "do", "n't", "like", "swimming", "."]
    assert examples[0].premise == ["i", "have", "two", "dogs", "."]
    # the same list pretty-printed: each record is reported at its own line
    path.write_text(json.dumps(DNLI_RECORDS, indent=1))
    lines = [e.line for e in read_dialogue_nli(path)]
    text_lines = path.read_text().splitlines()
    assert [text_lines[n - 1].strip() for n in lines] == ["{"] * 3
    # one record per line is read too
    write_jsonl(path, DNLI_RECORDS)
    assert [(e.line, e.label) for e in read_dialogue_nli(path)] == [(1, 0), (2, 2), (3, 1)]
    assert set(DNLI_LABELS) == {"positive", "neutral", "negative"}


def test_dialogue_nli_errors(tmp_path):
    path = tmp_path / "dnli.jsonl"
    path.write_text(json.dumps([*DNLI_RECORDS[:2], {**DNLI_RECORDS[2], "label": "entailment"}]))
    with pytest.raises(DataFormatError, match=r"dnli.jsonl:1: expected record 3 with label"):
        list(read_dialogue_nli(path))
    path.write_text(json.dumps(DNLI_RECORDS, indent=1)[:-30] + "\n")
    with pytest.raises(DataFormatError, match=r"dnli.jsonl:\d+: expected record 3 in JSON"):
        list(read_dialogue_nli(path))
    broken = [*DNLI_RECORDS[:1], {k: v for k, v in DNLI_RECORDS[1].items() if k != "sentence2"}]
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in broken) + "\n]\n")
    with pytest.raises(DataFormatError, match=r"dnli.jsonl:3: expected record 2 with string"):
        list(read_dialogue_nli(path))
    path.write_text('{"label": "positive"')
    with pytest.raises(DataFormatError, match=r"dnli.jsonl:1: expected record 1 in JSON"):
        list(read_dialogue_nli(path))


def test_dialogue_nli_datamodule(tmp_path):
    for split in ("train", "dev", "test"):
        (tmp_path / f"dialogue_nli_{split}.jsonl").write_text(json.dumps(DNLI_RECORDS))
    dm = DialogueNLIDataModule(data_dir=str(tmp_path), batch_size=2)
    dm.setup()
    assert dm.num_classes == 3 and dm.label_names == ("entailment", "neutral", "contradiction")
    assert sorted(dm.datasets["test"].labels.tolist()) == [0, 1, 2]
    batch = next(iter(dm.val_dataloader()))
    assert batch["premise"].shape[0] == 2


# ----------------------------------------------------------------------------- DataModules

def snli_dev_module(**kwargs) -> SNLIDataModule:
    path = shared_path(SNLI_DEV)
    return SNLIDataModule(data_dir=str(path.parent), train_file=path.name, val_file=path.name,
                          test_file=path.name, **kwargs)


def test_snli_datamodule_end_to_end():
    dm = snli_dev_module(batch_size=16)
    dm.setup("fit")
    examples = list(read_nli_jsonl(shared_path(SNLI_DEV)))
    assert len(dm.datasets["train"]) == len(examples)
    assert dm.dropped_no_gold == {"train": 16, "val": 16, "test": 16}
    assert dm.num_classes == 3 and dm.pad_id == 0 and dm.vocab_size == len(dm.vocab)
    assert dm.embeddings is None

    batch = next(iter(dm.train_dataloader()))
    B = 16
    assert batch["premise"].shape[0] == batch["hypothesis"].shape[0] == B
    assert batch["premise"].dtype == torch.long and batch["premise_mask"].dtype == torch.bool
    assert batch["premise_mask"].shape == batch["premise"].shape
    assert batch["hypothesis_mask"].shape == batch["hypothesis"].shape
    assert batch["label"].shape == batch["index"].shape == (B,)
    for side in ("premise", "hypothesis"):
        ids, mask = batch[side], batch[f"{side}_mask"]
        lengths = torch.tensor([len(getattr(examples[i], side)) for i in batch["index"]])
        assert torch.equal(mask.sum(1), lengths)
        assert torch.equal(mask, torch.arange(ids.shape[1]) < lengths[:, None])
        assert (ids[~mask] == dm.pad_id).all() and (ids[mask] != dm.pad_id).all()
        assert mask.any(0).all()  # no all-padding column: the batch is as short as it can be
    for row, i in enumerate(batch["index"].tolist()):
        assert dm.vocab.decode(batch["premise"][row]) == examples[i].premise  # vocab = train
        assert batch["label"][row] == examples[i].label


def test_eval_loader_covers_each_pair_once_in_a_fixed_order():
    dm = snli_dev_module(batch_size=50)
    first = torch.cat([b["index"] for b in dm.val_dataloader()])
    second = torch.cat([b["index"] for b in dm.val_dataloader()])
    assert torch.equal(first, second)
    assert sorted(first.tolist()) == list(range(len(dm.datasets["val"])))
    train = [torch.cat([b["index"] for b in dm.train_dataloader()]) for _ in range(2)]
    assert sorted(train[0].tolist()) == list(range(len(dm.datasets["train"])))


def test_max_train_examples_prefix_and_cached_vocab(monkeypatch):
    dm = snli_dev_module(max_train_examples=100, min_freq=2)
    dm.setup()
    examples = list(read_nli_jsonl(shared_path(SNLI_DEV)))[:100]
    assert len(dm.datasets["train"]) == 100
    assert len(dm.datasets["val"]) == len(list(read_nli_jsonl(shared_path(SNLI_DEV))))
    assert dm.datasets["train"].lines.tolist() == [e.line for e in examples]
    expected = Vocab.build([s for e in examples for s in (e.premise, e.hypothesis)],
                           min_freq=2, specials=(PAD, "<unk>"))
    assert dm.vocab.itos == expected.itos

    def no_build(*args, **kwargs):
        raise AssertionError("the vocabulary should come from the cache")

    monkeypatch.setattr(Vocab, "build", no_build)
    again = snli_dev_module(max_train_examples=100, min_freq=2)
    assert again.vocab.itos == expected.itos
    with pytest.raises(AssertionError, match="from the cache"):
        snli_dev_module(max_train_examples=100, min_freq=3).setup()  # other settings


def test_multinli_validates_matched_tests_both():
    folder = shared_path(MNLI)
    dm = MultiNLIDataModule(data_dir=str(folder), batch_size=2)
    assert isinstance(dm.val_dataloader(), torch.utils.data.DataLoader)
    matched, mismatched = dm.test_dataloader()
    assert dm.test_splits == ("matched", "mismatched")
    order = ["entailment", "neutral", "contradiction"]
    for split, loader in zip(dm.test_splits, (matched, mismatched)):
        records = [json.loads(line) for line in
                   (folder / f"multinli_1.0_dev_{split}.jsonl").read_text().splitlines()]
        expected = sorted(order.index(r["gold_label"]) for r in records)
        assert torch.cat([b["label"] for b in loader]).sort().values.tolist() == expected
    txt = MultiNLIDataModule(data_dir=str(folder), format="txt")
    assert not txt.datasets
    assert txt.vocab_size > 2 and len(txt.datasets["train"]) == 4  # vocab access sets up


def test_scitail_datamodule_two_classes():
    root = shared_path("samples/scitail__tsv_format_1.1.0/dummy_data/SciTailV1.1")
    dm = SciTailDataModule(data_dir=str(root), batch_size=8)
    assert dm.num_classes == 2 and dm.label_names == ("entailment", "neutral")
    batch = next(iter(dm.test_dataloader()))
    assert batch["label"].tolist() and set(batch["label"].tolist()) == {0, 1}


def test_missing_files_name_url_and_path(tmp_path):
    dm = SNLIDataModule(data_dir=str(tmp_path), download=False)
    with pytest.raises(FileNotFoundError, match=r"snli_1.0_train.jsonl.*snli_1.0.zip"):
        dm.prepare_data()
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "snli_1.0_train.jsonl")):
        dm.setup()
    with pytest.raises(ValueError, match="tokenizer"):
        SNLIDataModule(data_dir=str(tmp_path), tokenizer="bpe")


def test_prepare_data_fetches_and_unpacks_the_archive(tmp_path, monkeypatch):
    source = shared_path(SNLI_DEV)
    archive = tmp_path / "release" / "snli_1.0.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as z:  # the official layout: snli_1.0/<files>
        for split in ("train", "dev", "test"):
            z.write(source, f"snli_1.0/snli_1.0_{split}.jsonl")
    monkeypatch.setattr(SNLIDataModule, "url", archive.as_uri())
    data_dir = tmp_path / "data"
    dm = SNLIDataModule(data_dir=str(data_dir), max_train_examples=10)
    dm.prepare_data()
    assert (data_dir / "snli_1.0.zip").exists()
    assert dm.path("train") == data_dir / "snli_1.0" / "snli_1.0_train.jsonl"
    dm.setup()
    assert len(dm.datasets["train"]) == 10 and dm.dropped_no_gold["val"] == 16


def test_a_relative_vectors_path_is_found_under_the_data_root(tmp_path, monkeypatch):
    """The paper configs name ``glove/glove.840B.300d.txt``: under $ATTNREPRO_DATA (where
    ``python -m datamodules.fetch glove`` puts it), whatever the working directory; a path
    that exists from the working directory, or an absolute one, is kept."""
    from datamodules.nli import SNLIDataModule

    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "root"))
    monkeypatch.chdir(tmp_path)
    dm = SNLIDataModule(data_dir=str(tmp_path), vectors="glove/glove.840B.300d.txt")
    assert dm.vectors == str(tmp_path / "root" / "glove" / "glove.840B.300d.txt")
    (tmp_path / "mine.txt").write_text("a 0.1\n")
    assert SNLIDataModule(data_dir=str(tmp_path), vectors="mine.txt").vectors == "mine.txt"
    absolute = str(tmp_path / "elsewhere.txt")
    assert SNLIDataModule(data_dir=str(tmp_path), vectors=absolute).vectors == absolute
