"""Translation and text-to-code DataModules (datamodules/translation.py): the readers on the
real shared files (IWSLT'15 tst2012 and Stanford vocabularies, WMT'14 newstest2014 SGML, the
tensor2tensor AlgoLisp record), on the synthetic WMT'16 En-Ro fixture (tests/fixtures) or on
files written here in the published formats, the
batches TransformerSeq2Seq reads, decoding back to the references' form, length filtering and
the errors on malformed input."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from datamodules.algolisp import AlgoLispDataModule, flatten_program, read_algolisp
from datamodules.common import DataFormatError
from datamodules.iwslt import IWSLT15DataModule, read_stanford_vocab
from datamodules.text import SPECIALS
from datamodules.translation import moses_tokenize_test, read_sgml, read_sgml_segments
from datamodules.wmt import WMT14DataModule, WMT16EnRoDataModule, prepare_romanian
from tests.conftest import shared_path
from tests.fixtures.make_fixtures import FIXTURES

FIRST_TST2012_EN = (
    "How can I speak in 10 minutes about the bonds of women over three generations , about how "
    "the astonishing strength of those bonds took hold in the life of a four-year-old girl "
    "huddled with her young sister , her mother and her grandmother for five days and nights "
    "in a small boat in the China Sea more than 30 years ago , bonds that took hold in the "
    "life of that small girl and never let go -- that small girl now living in San Francisco "
    "and speaking to you today ?")
LAST_TST2012_VI = ("Đó chính là câu hỏi mà chúng ta sẽ phải lo lắng trong 50 năm tiếp theo .")
T2T_TARGET = ("[ invoke1 [ lambda1 [ if [ == [ len [ digits arg1 ] ] 1 ] 0 [ + 1 [ self "
              "[ reduce [ digits arg1 ] 0 + ] ] ] ] ] a ]")  # program_search_test.py
SGM = "newstest2014-deen-{}.sgm"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Vocabularies, BPE models and tokenized text are cached in a fresh folder per test."""
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))


def iwslt(tmp_path: Path | None = None, **kwargs) -> IWSLT15DataModule:
    """The shared IWSLT'15 folder with tst2012 for val and test (no tst2013 there)."""
    folder = shared_path("iwslt15_en_vi")
    args = {"train_prefix": "train.first1000", "test_prefix": "tst2012", "batch_size": 16}
    return IWSLT15DataModule(str(folder), **(args | kwargs))


def assert_batch(batch: dict, pad_id=0, bos_id=2, eos_id=3) -> None:
    """The batch of TransformerSeq2Seq: shapes, dtypes, <s>/</s>/<pad> where they belong."""
    b = batch["src"].shape[0]
    assert set(batch) == {"src", "src_mask", "tgt_in", "tgt_out", "tgt_mask", "index"}
    assert batch["src"].dtype == batch["tgt_in"].dtype == batch["index"].dtype == torch.long
    assert batch["src_mask"].dtype == batch["tgt_mask"].dtype == torch.bool
    assert batch["src"].shape == batch["src_mask"].shape
    assert batch["tgt_in"].shape == batch["tgt_out"].shape == batch["tgt_mask"].shape
    assert batch["index"].shape == (b,)
    assert (batch["src"][~batch["src_mask"]] == pad_id).all()
    assert (batch["tgt_out"][~batch["tgt_mask"]] == pad_id).all()
    assert (batch["tgt_in"][:, 0] == bos_id).all()
    lengths = batch["tgt_mask"].sum(1)
    for row in range(b):
        n = int(lengths[row])
        assert batch["tgt_out"][row, n - 1] == eos_id  # target + </s>
        assert torch.equal(batch["tgt_in"][row, 1:n], batch["tgt_out"][row, :n - 1])
        assert eos_id not in batch["tgt_out"][row, :n - 1].tolist()


# ---------------------------------------------------------------------------------------
# IWSLT'15


def test_stanford_vocab_ids_shift_by_one():
    vocab_en = read_stanford_vocab(shared_path("iwslt15_en_vi/vocab.en"))
    vocab_vi = read_stanford_vocab(shared_path("iwslt15_en_vi/vocab.vi"))
    assert (len(vocab_en), len(vocab_vi)) == (17191 + 1, 7709 + 1)  # + <pad>
    assert vocab_en.itos[:4] == list(SPECIALS)
    # the 4th line of each file (Stanford id 3) gets id 4
    assert vocab_en.stoi["Rachel"] == 4 and vocab_vi.stoi["Khoa"] == 4
    lines = shared_path("iwslt15_en_vi/vocab.en").read_text(encoding="utf-8").split("\n")
    assert vocab_en.itos[1:] == lines[:17191]


@pytest.mark.parametrize("source, target", [("en", "vi"), ("vi", "en")])
def test_iwslt_reads_tst2012_in_both_directions(source, target):
    dm = iwslt(source=source, target=target)
    sizes = {"en": 17192, "vi": 7710}
    assert (dm.src_vocab_size, dm.tgt_vocab_size) == (sizes[source], sizes[target])
    assert (dm.pad_id, dm.bos_id, dm.eos_id) == (0, 2, 3)
    en = dm.sources("val") if source == "en" else dm.references("val")
    vi = dm.references("val") if target == "vi" else dm.sources("val")
    assert len(en) == len(vi) == len(dm.raw_references("val")) == 1553
    assert en[0] == FIRST_TST2012_EN and vi[-1] == LAST_TST2012_VI
    dm.setup("validate")
    data = dm.datasets["val"]
    assert len(data) == 1553 and data.index.tolist() == list(range(1553))
    assert dm.decode(data.tgt(1552)) == (LAST_TST2012_VI if target == "vi" else en[-1])


def test_iwslt_unknown_words_and_round_trip():
    dm = iwslt()
    line = dm.sources("val")[2]
    assert line == "It is a jigsaw puzzle still being put together ."
    ids = dm.src_tokenizer.encode(line.split(" "))
    assert ids[3] == 1 and ids.count(1) == 1  # "jigsaw" is not in vocab.en
    assert "jigsaw" not in dm.src_tokenizer.vocab.stoi
    # target side: the first reference has out-of-vocabulary words; decode keeps <unk>
    reference = dm.references("val")[0]
    ids = dm.tgt_tokenizer.encode(reference.split(" "))
    decoded = dm.decode([2, *ids, 3, 0, 0])
    words = reference.split(" ")
    assert decoded.split(" ") == [w if w in dm.tgt_tokenizer.vocab.stoi else "<unk>"
                                  for w in words]
    assert "<unk>" in decoded and dm.decode([2, *dm.tgt_tokenizer.encode(["Khoa"]), 3, 5]) == "Khoa"
    # every in-vocabulary reference comes back exactly
    refs = dm.references("val")
    known = [r for r in refs if all(w in dm.tgt_tokenizer.vocab.stoi for w in r.split(" "))]
    assert len(known) > 300
    assert all(dm.decode(dm.tgt_tokenizer.encode(r.split(" "))) == r for r in known)


def test_iwslt_raw_references_are_moses_detokenized():
    dm = iwslt(source="vi", target="en")
    raw = dm.raw_references("val")
    assert raw[0].startswith("How can I speak in 10 minutes about the bonds of women over three "
                             "generations, about how")
    assert raw[0].endswith("speaking to you today?")
    assert dm.detokenize("It &apos;s a &quot; test &quot; .") == 'It\'s a "test".'
    assert all("&apos;" not in r and "&quot;" not in r for r in raw)


def test_iwslt_batches_and_training_filter(caplog):
    dm = iwslt()
    with caplog.at_level(logging.WARNING, logger="datamodules.translation"):
        dm.setup("fit")
    # first 1,000 training pairs: line 1 of train.en is empty, 71 pairs exceed 50 words
    assert dm.stats["train"] == {"examples": 928, "empty": 1, "too_long": 71}
    assert "72 of 1000 pairs dropped (empty: 1, too_long: 71)" in caplog.text
    train = dm.datasets["train"]
    assert max(train.sequences.offsets.diff().tolist()) <= 50
    index = train.index.tolist()
    assert index == sorted(index) and len(set(index)) == 928 and max(index) == 999
    seen = []
    for batch in dm.val_dataloader():
        assert_batch(batch)
        assert batch["src"].shape[0] <= 16
        seen += batch["index"].tolist()
        i = int(batch["index"][0])
        assert dm.decode(batch["tgt_out"][0]) == dm.decode(dm.datasets["val"].tgt(i))
    assert sorted(seen) == list(range(1553))
    assert_batch(next(iter(dm.train_dataloader())))


def test_iwslt_truncate_and_train_size():
    dm = iwslt(train_size=200, truncate_long=True, max_len=20)
    dm.setup("fit")
    stats = dm.stats["train"]
    assert stats["examples"] == 200 and stats["truncated"] > 0 and "too_long" not in stats
    assert max(dm.datasets["train"].sequences.offsets.diff().tolist()) == 20
    unlimited = iwslt(train_size=500, max_len=0)  # 0: no length limit
    unlimited.setup("fit")
    assert unlimited.stats["train"] == {"examples": 499, "empty": 1}  # line 470 of train.en: empty


def test_iwslt_missing_file_names_path_and_release_name(tmp_path):
    folder = tmp_path / "iwslt"
    folder.mkdir()
    for name in ("tst2012.en", "tst2012.vi", "vocab.en", "vocab.vi"):
        shutil.copy(shared_path(f"iwslt15_en_vi/{name}"), folder / name)
    dm = IWSLT15DataModule(str(folder))
    with pytest.raises(FileNotFoundError) as err:
        dm.setup("test")
    message = str(err.value)
    assert str(folder / "tst2013.en") in message and "calls it tst2013.en" in message
    assert "nlp.stanford.edu" in message
    with pytest.raises(FileNotFoundError, match=r"train\.en"):
        dm.setup("fit")
    dm.setup("validate")  # what is there works
    assert len(dm.datasets["val"]) == 1553


def test_iwslt_mismatched_line_counts(tmp_path):
    (tmp_path / "tst2012.en").write_text("a b\nc d\ne\n")
    (tmp_path / "tst2012.vi").write_text("x\ny\n")
    for lang in ("en", "vi"):
        (tmp_path / f"vocab.{lang}").write_text("<unk>\n<s>\n</s>\na\nx\n")
    dm = IWSLT15DataModule(str(tmp_path))
    with pytest.raises(DataFormatError) as err:
        dm.sources("val")
    message = str(err.value)
    assert str(tmp_path / "tst2012.en") in message and str(tmp_path / "tst2012.vi") in message
    assert "3 lines" in message and "(2 lines" in message


@pytest.mark.parametrize("content, line, expected", [
    ("<unk>\n</s>\n<s>\na\n", 2, "'<s>'"),
    ("<unk>\n<s>\n</s>\na\nb\na\n", 6, "each word once"),
    ("<unk>\n<s>\n</s>\na\n\nb\n", 5, "one word per line"),
    ("<unk>\n<s>\n</s>\n<pad>\n", 4, "each word once"),
])
def test_stanford_vocab_errors(tmp_path, content, line, expected):
    path = tmp_path / "vocab.en"
    path.write_text(content)
    with pytest.raises(DataFormatError, match=rf"vocab.en:{line}: expected {expected}"):
        read_stanford_vocab(path)


def test_bad_directions_and_arguments():
    with pytest.raises(ValueError, match="directions"):
        IWSLT15DataModule("x", source="en", target="de")
    with pytest.raises(ValueError, match="truncate_long"):
        IWSLT15DataModule("x", max_len=None, truncate_long=True)


# ---------------------------------------------------------------------------------------
# WMT'14 SGML and the WMT module


def test_sgml_reader_on_newstest2014():
    folder = shared_path("wmt14_en_de")
    src = read_sgml_segments(folder / SGM.format("src.en"))
    ref = read_sgml(folder / SGM.format("ref.de"))
    assert len(src) == len(ref) == 3003
    assert src[0].text == "Gutach: Increased safety for pedestrians"
    assert (src[0].doc, src[0].id, src[0].line) == ("10023-schwarzwaelder-bote.de", "1", 3)
    assert ref[0] == "Gutach: Noch mehr Sicherheit für Fußgänger"
    assert src[-1].text == ("However, following the recent murder of Australian travel agent "
                            "Michelle Smith in Phuket, Thailand may also be looking to repair "
                            "its battered tourist image, leading to an acquittal.")
    assert ref[-1] == ("Allerdings ist es auch möglich, dass Thailand nach der kürzlichen "
                       "Ermordung der Reisekauffrau Michelle Smith in Phuket bemüht sein könnte, "
                       "sein angeschlagenes touristisches Image zu verbessern, und es deshalb zu "
                       "einem Freispruch kommt.")
    ref_segments = read_sgml_segments(folder / SGM.format("ref.de"))
    assert [(s.doc, s.id) for s in src] == [(s.doc, s.id) for s in ref_segments]
    assert read_sgml(folder / SGM.format("ref.en")) == [s.text for s in src]  # same text
    # a bare "&" (the files write no entities) is kept; segment 1936 pairs with its source
    assert src[1935].text.startswith("This week Standard & Poor's, the rating agency")
    assert ref[1935].startswith("Diese Woche bezeichnete die Rating-Agentur Standard & Poor's")


def test_sgml_entities_whitespace_and_errors(tmp_path):
    path = tmp_path / "x.sgm"
    path.write_text('<srcset setid="t" srclang="any">\n<doc docid="d1" genre="news">\n'
                    '<seg id="1">  A &quot;b&quot;  &amp; c &lt;d&gt;  </seg>\n'
                    '<p>\n<seg id=2>plain & raw</seg>\n</p>\n</doc>\n</srcset>\n')
    segments = read_sgml_segments(path)
    assert [s.text for s in segments] == ['A "b" & c <d>', "plain & raw"]
    assert [(s.doc, s.id, s.line) for s in segments] == [("d1", "1", 3), ("d1", "2", 5)]
    for bad, line in (('<seg id="3">no end\n', 3), ('<seg id="3">a</seg><seg id="4">b</seg>\n', 3)):
        path.write_text('<srcset>\n<doc docid="d">\n' + bad + "</doc>\n")
        with pytest.raises(DataFormatError, match=rf"x.sgm:{line}: expected one whole <seg"):
            read_sgml(path)
    path.write_text("<srcset>\n</srcset>\n")
    with pytest.raises(DataFormatError, match=r"x.sgm: expected at least one <seg>"):
        read_sgml(path)


def test_moses_tokenization_as_fairseq_prepare_script():
    assert moses_tokenize_test('Standard & Poor’s "rich-text" [x] a|b', "en") == [
        "Standard", "&amp;", "Poor", "&apos;s", "&quot;", "rich", "@-@", "text", "&quot;",
        "&#91;", "x", "&#93;", "a", "&#124;", "b"]


def write_wmt_train(folder: Path) -> list[tuple[str, str]]:
    pairs = [("The house is small.", "Das Haus ist klein."),
             ("The house is big.", "Das Haus ist groß."),
             ("A rich-text format, \"quoted\".", "Ein Rich-Text-Format, „zitiert“."),
             ("Gutach: Increased safety for pedestrians", "Gutach: Noch mehr Sicherheit für "
              "Fußgänger"),
             ("", "Leer"),
             ("One two three four five six seven eight nine ten.", "Eins."),
             ]
    (folder / "train.en").write_text("\n".join(s for s, _ in pairs) + "\n", encoding="utf-8")
    (folder / "train.de").write_text("\n".join(t for _, t in pairs) + "\n", encoding="utf-8")
    (folder / "dev.en").write_text("The house is small.\nThe safety.\n", encoding="utf-8")
    (folder / "dev.de").write_text("Das Haus ist klein.\nDie Sicherheit.\n", encoding="utf-8")
    return pairs


def test_wmt_module_on_written_training_text_and_real_test(tmp_path, caplog):
    folder = shared_path("wmt14_en_de")
    write_wmt_train(tmp_path)
    dm = WMT14DataModule(str(tmp_path), val_source_file="dev.en", val_target_file="dev.de",
                         test_source_file=str(folder / SGM.format("src.en")),
                         test_target_file=str(folder / SGM.format("ref.de")),
                         bpe_vocab_size=300, batch_size=4)
    assert dm.bleu == "tokenized+compound_split"
    assert dm.src_vocab_size == dm.tgt_vocab_size and dm.src_tokenizer is dm.tgt_tokenizer
    assert (dm.pad_id, dm.bos_id, dm.eos_id) == (0, 2, 3)
    with caplog.at_level(logging.WARNING, logger="datamodules.translation"):
        dm.setup("fit")
    # the empty English line and the 11:2-token pair (clean-corpus-n -ratio 1.5) are dropped
    assert dm.stats["train"] == {"examples": 4, "empty": 1, "ratio": 1}
    assert "2 of 6 pairs dropped" in caplog.text
    assert dm.references("val") == ["Das Haus ist klein .", "Die Sicherheit ."]
    assert dm.raw_references("val") == ["Das Haus ist klein.", "Die Sicherheit."]
    # training text: normalize-punctuation turns „…“ into "…", then tokenizer.perl -a escapes
    train = dm._tokenized_training_text(tmp_path / "train.en", tmp_path / "train.de", None)
    assert train[1].read_text(encoding="utf-8").split("\n")[2] == (
        "Ein Rich @-@ Text @-@ Format , &quot; zitiert &quot; .")
    # decode gives back the Moses-tokenized words of in-vocabulary text
    tokenizer = dm.tgt_tokenizer
    for reference in dm.references("val") + ["Ein Rich @-@ Text @-@ Format , &quot; zitiert "
                                             "&quot; ."]:
        ids = tokenizer.encode(reference.split(" "))
        assert dm.decode([2, *ids, 3, 0]) == reference
    # the real test set: 3,003 Moses-tokenized references, raw ones as in the SGML
    refs, raw = dm.references("test"), dm.raw_references("test")
    assert len(refs) == len(raw) == len(dm.sources("test")) == 3003
    assert refs[0] == "Gutach : Noch mehr Sicherheit für Fußgänger"
    assert raw[0] == "Gutach: Noch mehr Sicherheit für Fußgänger"
    assert dm.decode([2, *tokenizer.encode(refs[0].split(" ")), 3]) == refs[0]
    assert dm.detokenize(refs[0]) == raw[0]
    for batch in dm.val_dataloader():
        assert_batch(batch)


def test_wmt_split_test_for_training_on_newstest2014():
    folder = shared_path("wmt14_en_de")
    dm = WMT14DataModule(str(folder), split_test_for_training=2500, bpe_vocab_size=2000,
                         batch_size=64, train_size=1000)
    dm.setup()
    assert dm.stats["train"]["examples"] + dm.stats["train"].get("ratio", 0) == 1000
    assert len(dm.datasets["val"]) == len(dm.datasets["test"]) == 503
    ref = read_sgml(folder / SGM.format("ref.de"))
    assert dm.raw_references("test") == ref[2500:]
    src = read_sgml(folder / SGM.format("src.en"))
    assert dm.sources("val") == src[2500:]
    refs = dm.references("test")
    batch = next(iter(dm.test_dataloader()))
    assert_batch(batch)
    i = int(batch["index"][0])
    ids = dm.tgt_tokenizer.encode(refs[i].split(" "))
    if dm.tgt_tokenizer.unk_id not in ids:
        assert dm.decode(batch["tgt_out"][0]) == refs[i]


def test_wmt_misaligned_sgml_and_missing_files(tmp_path):
    (tmp_path / "a.sgm").write_text('<doc docid="d">\n<seg id="1">a</seg>\n<seg id="2">b</seg>\n')
    (tmp_path / "b.sgm").write_text('<doc docid="d">\n<seg id="1">x</seg>\n<seg id="3">y</seg>\n')
    (tmp_path / "c.sgm").write_text('<doc docid="d">\n<seg id="1">x</seg>\n')
    dm = WMT14DataModule(str(tmp_path), val_source_file="a.sgm", val_target_file="b.sgm")
    with pytest.raises(DataFormatError, match=r"b.sgm:3: expected the segment of .*a.sgm:3"):
        dm.references("val")
    dm = WMT14DataModule(str(tmp_path), val_source_file="a.sgm", val_target_file="c.sgm")
    with pytest.raises(DataFormatError, match=r"a.sgm: expected as many segments as .*c.sgm "
                                              r"\(1 segments.*got '2 segments'"):
        dm.references("val")
    dm = WMT14DataModule(str(tmp_path), source="en", target="fr")
    assert dm.bleu == "tokenized"
    with pytest.raises(FileNotFoundError, match=r"newstest2014-fren-src\.en\.sgm"):
        dm.references("test")
    with pytest.raises(FileNotFoundError, match=r"train\.en"):
        dm.src_vocab_size  # noqa: B018  (the BPE is learnt from the training text)


# ---------------------------------------------------------------------------------------
# AlgoLisp


def test_algolisp_shared_record_flattened_as_tensor2tensor():
    examples = read_algolisp(shared_path("algolisp/t2t_program_search_test_example.jsonl"))
    assert len(examples) == 1
    assert " ".join(examples[0].program) == T2T_TARGET
    assert " ".join(examples[0].text) == (
        "given a number a , find how many times you can replace a with sum of its digits "
        "before it becomes a single digit number")
    assert flatten_program(["f", ["g", "x"]], "()") == ["(", "f", "(", "g", "x", ")", ")"]


def write_algolisp(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


RECORDS = [
    {"text": ["given", "a", ",", "return", "a"], "short_tree": ["invoke1", ["lambda1", "arg1"],
                                                                "a"], "tests": []},
    {"text": ["given", "b", ",", "double", "b"], "short_tree": ["*", "b", "2"], "args": {}},
    {"text": ["sum", "of", "list", "c"], "short_tree": ["reduce", "c", "0", "+"]},
]


def test_algolisp_module_on_written_files(tmp_path):
    write_algolisp(tmp_path / "metaset3.train.jsonl", RECORDS)
    write_algolisp(tmp_path / "metaset3.dev.jsonl", RECORDS[1:])
    write_algolisp(tmp_path / "metaset3.test.jsonl", [
        {"text": ["unseen", "a"], "short_tree": ["max", "a", "b"]}, RECORDS[0]])
    dm = AlgoLispDataModule(str(tmp_path), batch_size=2)
    assert dm.bleu is None and AlgoLispDataModule.bleu is None
    # text: given a , return b double sum of list c; programs: [ ] invoke1 lambda1 arg1 a *
    # b 2 reduce c 0 +
    assert (dm.src_vocab_size, dm.tgt_vocab_size) == (4 + 10, 4 + 13)
    dm.setup()
    assert dm.references("val") == ["[ * b 2 ]", "[ reduce c 0 + ]"]
    assert dm.raw_references("val") == dm.references("val")
    assert dm.sources("test") == ["unseen a", "given a , return a"]
    assert dm.references("test")[1] == "[ invoke1 [ lambda1 arg1 ] a ]"
    decoded = {}
    for batch in dm.test_dataloader():
        assert_batch(batch)
        for i, row in zip(batch["index"].tolist(), batch["tgt_out"]):
            decoded[i] = dm.decode(row)
    assert decoded == {0: "[ <unk> a b ]", 1: "[ invoke1 [ lambda1 arg1 ] a ]"}
    assert dm.detokenize("[ a ]") == "[ a ]"


@pytest.mark.parametrize("line, expected", [
    ('{"text": ["a"], "short_tree": ["f"]', "a JSON object"),
    ('["text", "short_tree"]', "a JSON object"),
    ('{"text": "a b", "short_tree": ["f"]}', '"text": a non-empty list'),
    ('{"text": ["a"], "short_tree": ["f", 1]}', '"short_tree": a non-empty nested list'),
    ('{"text": ["a"]}', '"short_tree"'),
])
def test_algolisp_malformed_lines(tmp_path, line, expected):
    path = tmp_path / "metaset3.train.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n\n" + line + "\n")
    with pytest.raises(DataFormatError, match=rf"metaset3.train.jsonl:3: expected {expected}"):
        read_algolisp(path)


def test_algolisp_missing_file(tmp_path):
    dm = AlgoLispDataModule(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"metaset3\.train\.jsonl"):
        dm.tgt_vocab_size  # noqa: B018


# ---------------------------------------------------------------------------------------
# WMT'16 En-Ro on the synthetic fixture (tests/fixtures/wmt16_en_ro, make_fixtures.py)

WMT16_FIXTURE = FIXTURES / "wmt16_en_ro"
# segment 1 of newsdev2016 (both directions hold the same pairs) and the 12th, with "&amp;"
DEV_EN, DEV_RO = "The small cat likes the country.", "Cel mic pisică iubește cel țară."
DEV_EN_TOK, DEV_RO_TOK = "The small cat likes the country .", "Cel mic pisică iubește cel țară ."
AMP_EN, AMP_RO = "The cat & the dog.", "Cel pisică & cel câine."


def wmt16(source="en", target="ro", **kwargs) -> WMT16EnRoDataModule:
    return WMT16EnRoDataModule(str(WMT16_FIXTURE), source=source, target=target,
                               **({"bpe_merges": 20, "batch_size": 8} | kwargs))


@pytest.mark.parametrize("source, target", [("en", "ro"), ("ro", "en")])
def test_wmt16_fixture_in_both_directions(source, target):
    dm = wmt16(source, target)
    assert dm.bleu == WMT16EnRoDataModule.bleu == "tokenized"
    # one joint BPE: 4 specials + characters + word-final characters + exactly 20 merges
    assert dm.src_tokenizer is dm.tgt_tokenizer and dm.src_vocab_size == dm.tgt_vocab_size
    assert dm.tgt_vocab_size == dm.bpe_size() == 70
    model = json.loads(dm.tgt_tokenizer.cache_path.read_text(encoding="utf-8"))["model"]
    assert len(model["merges"]) == 20
    assert (dm.pad_id, dm.bos_id, dm.eos_id) == (0, 2, 3)
    dm.setup()
    assert dm.stats == {"train": {"examples": 48}, "val": {"examples": 12},
                        "test": {"examples": 12}}
    en_first, ro_first = (DEV_EN, DEV_RO_TOK) if target == "ro" else (DEV_RO, DEV_EN_TOK)
    for stage in ("val", "test"):
        assert len(dm.sources(stage)) == len(dm.references(stage)) == 12
        assert len(dm.raw_references(stage)) == 12
    assert dm.sources("val")[0] == en_first and dm.references("val")[0] == ro_first
    assert dm.raw_references("val")[0] == (DEV_RO if target == "ro" else DEV_EN)
    # the 12th segment: the SGML's &amp; unescaped in the raw text, Moses-escaped in the
    # tokenized reference
    assert dm.raw_references("test")[-1] == (AMP_RO if target == "ro" else AMP_EN)
    assert dm.references("test")[-1] == ("Cel pisică &amp; cel câine ." if target == "ro"
                                         else "The cat &amp; the dog .")
    # the first training pair (file order), Moses-tokenized; line 2 of train.ro writes ş ţ
    train = dm.datasets["train"]
    assert train.index.tolist() == list(range(48))
    first = {"en": "A cat likes the house .", "ro": "Un pisică iubește cel casă ."}
    assert dm.decode(train.tgt(0)) == first[target]
    assert dm.decode(train.src(0)) == first[source]  # (one BPE for both sides)
    assert dm.decode(train.tgt(1)) == ("Cel mic pisică iubeşte cel ţară astăzi ." if target == "ro"
                                       else "The small cat likes the country today .")
    # decode round trip: every reference comes back but the one with "&", which no training
    # line has (its characters are <unk>)
    for stage in ("val", "test"):
        refs, raw = dm.references(stage), dm.raw_references(stage)
        for ref in refs[:-1]:
            assert dm.decode([2, *dm.tgt_tokenizer.encode(ref.split(" ")), 3, 0]) == ref
        assert "<unk>" in dm.decode(dm.tgt_tokenizer.encode(refs[-1].split(" ")))
        assert [dm.detokenize(r) for r in refs] == raw
    seen = []
    for batch in dm.val_dataloader():
        assert_batch(batch)
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(12))
    assert_batch(next(iter(dm.train_dataloader())))


def test_wmt16_romanian_preparation():
    text = "Ţara şi ţărmul: Ș ș Ț ț Ă ă Â â Î î"
    assert prepare_romanian(text) == text
    assert prepare_romanian(text, "normalise") == "Țara și țărmul: Ș ș Ț ț Ă ă Â â Î î"
    assert prepare_romanian(text, "remove_diacritics") == "Tara si tarmul: S s T t A a A a I i"
    with pytest.raises(ValueError, match="romanian must be one of"):
        prepare_romanian(text, "strip")
    # "keep": the training text's two spellings stay apart; "normalise" merges them (ş, ţ
    # and the word-final ş of "covoraş" leave the BPE alphabet: 3 ids fewer)
    keep, normalised = wmt16(), wmt16(romanian="normalise")
    words = {w for _, ro in keep.split_text("train").pairs for w in ro}
    assert {"iubește", "iubeşte", "țară", "ţară"} <= words
    words = {w for _, ro in normalised.split_text("train").pairs for w in ro}
    assert "iubește" in words and not {"iubeşte", "ţară"} & words
    assert keep.bpe_size() - normalised.bpe_size() == 3
    # the Moses-tokenized training text is cached per preparation (the English side shared)
    paths = [dm._tokenized_training_text(WMT16_FIXTURE / "train.en",
                                         WMT16_FIXTURE / "train.ro", None)
             for dm in (keep, normalised)]
    assert paths[0][0] == paths[1][0] and paths[0][1] != paths[1][1]
    # "remove_diacritics" into Romanian: references and raw references without diacritics
    dm = wmt16(romanian="remove_diacritics")
    assert dm.references("val")[0] == "Cel mic pisica iubeste cel tara ."
    assert dm.raw_references("val")[-1] == "Cel pisica & cel caine."
    assert dm.sources("val")[0] == DEV_EN
    # from Romanian (wmt16-scripts' Ro->En): the source is stripped, the English untouched
    dm = wmt16("ro", "en", romanian="remove_diacritics")
    assert dm.sources("val")[0] == "Cel mic pisica iubeste cel tara."
    assert dm.references("val")[0] == DEV_EN_TOK
    dm.setup("fit")
    assert dm.decode(dm.datasets["train"].src(1)) == "Cel mic pisica iubeste cel tara astazi ."


def test_wmt16_sgml_naming_errors(tmp_path):
    # defaults: the release's names for the direction ("roen" files for Ro->En)
    dm = WMT16EnRoDataModule(str(tmp_path), source="ro", target="en")
    with pytest.raises(FileNotFoundError) as err:
        dm.references("test")
    message = str(err.value)
    assert str(tmp_path / "newstest2016-roen-src.ro.sgm") in message
    assert "the WMT'16 release calls it test/newstest2016-roen-src.ro.sgm" in message
    assert "wmt16/translation-task/test.tgz" in message
    shutil.copy(WMT16_FIXTURE / "newsdev2016-enro-src.en.sgm", tmp_path)
    dm = WMT16EnRoDataModule(str(tmp_path))  # en -> ro: the source is there, not the target
    with pytest.raises(FileNotFoundError, match=r"val_target_file='newsdev2016-enro-ref\.ro\.sgm'"
                                                r".*calls it dev/newsdev2016-enro-ref\.ro\.sgm"):
        dm.references("val")
    with pytest.raises(FileNotFoundError, match=r"training text .* not found at .*train\.en"):
        dm.src_vocab_size  # noqa: B018  (the BPE is learnt from the training text)
    # the En->Ro names in the Ro->En direction: caught by the .<language>.sgm ending
    with pytest.raises(ValueError, match=r"val_source_file='newsdev2016-enro-src\.en\.sgm' names "
                                         r".*the en side .* but the source language is ro"):
        WMT16EnRoDataModule(str(WMT16_FIXTURE), source="ro", target="en",
                            val_source_file="newsdev2016-enro-src.en.sgm")
    with pytest.raises(ValueError, match=r"test_target_file=.*'newstest2016-roen-ref\.ro\.sgm'"):
        WMT16EnRoDataModule(source="ro", target="en",
                            test_target_file="newstest2016-{pair}-ref.{src}.sgm")
    with pytest.raises(ValueError, match=r"placeholders \{src\}, \{tgt\} and \{pair\} only"):
        WMT16EnRoDataModule(val_source_file="newsdev2016-{lang}-src.sgm")
    # one side SGML, the other plain text
    (tmp_path / "dev.ro").write_text("Un câine.\n", encoding="utf-8")
    dm = WMT16EnRoDataModule(str(tmp_path), val_target_file="dev.ro")
    with pytest.raises(ValueError, match="both SGML"):
        dm.references("val")
    for kwargs, match in (({"romanian": "strip"}, "romanian must be one of"),
                          ({"bpe_merges": 0},
                           "WMT16EnRoDataModule: bpe_merges must be at least 1, got 0"),
                          ({"target": "de"}, "directions")):
        with pytest.raises(ValueError, match=match):
            WMT16EnRoDataModule(str(tmp_path), **kwargs)
