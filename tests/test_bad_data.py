"""Bad input across every reader and DataModule (issue 16, item 4, and the DataModule part of
item 5): an empty file, a truncated last line, wrong columns or keys, bytes that are not
UTF-8, parallel files of different lengths, a label outside the label set, a missing file,
a directory or an unreadable file in place of a file, and sizes below 1.  Each is one
error naming the file, the line and what was expected (asserted in full), and the command
prints it as its one line of error, whether the vocabulary link, the fit's ``setup`` or a
DataModule's constructor met it.

The bad files are written here, in the published formats (their valid lines are the first
lines of the real files, shortened); no test needs ../shared/data."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import datamodules.common as common
from datamodules.algolisp import AlgoLispDataModule, read_algolisp
from datamodules.common import DataFormatError, MissingDataFile, Vocab
from datamodules.glove import read_glove, vocab_vectors
from datamodules.imdb import IMDbDataModule, read_aclimdb, read_review
from datamodules.iwslt import IWSLT15DataModule, read_stanford_vocab
from datamodules.lm1b import LM1BDataModule, read_sentences
from datamodules.mlu import MLUDataModule, read_problems
from datamodules.nli import (
    SCITAIL_SNLI_LABELS,
    DialogueNLIDataModule,
    MultiNLIDataModule,
    SciTailDataModule,
    SNLIDataModule,
    read_dialogue_nli,
    read_nli,
    read_scitail_tsv,
)
from datamodules.ranking import (
    WIKIQA_FILTERED_HOW,
    TrecQADataModule,
    UbuntuDataModule,
    WikiQADataModule,
    read_trecqa,
    read_ubuntu,
    read_wikiqa_filtered,
    read_wikiqa_tsv,
)
from datamodules.sst import SSTDataModule, read_glue_sst2, read_sst_ptb
from datamodules.sva import SVADataModule, read_linzen
from datamodules.translation import read_parallel_lines, read_sgml_segments, read_text_pairs
from datamodules.wmt import WMT14DataModule, WMT16EnRoDataModule
from experiments import coda_mt, coda_nli, coda_ranking, dwin_classification
from experiments.errors import data_error_in, unwrapped
from tests.test_cli import error

ROOT = Path(__file__).resolve().parents[1]
BAD_BYTES = b"caf\xe9 au lait\n"  # Latin-1, not UTF-8
UTF16_START = b"\xff\xfe["  # a file saved as UTF-16
DEBUG_HINT = " (ATTNREPRO_DEBUG=1 shows the traceback)"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- valid lines

def snli(label: str = "neutral", **fields) -> str:
    """An SNLI 1.0 JSON line (the first dev pair, its keys as published), ``fields`` changed
    (None: left out)."""
    record = {"gold_label": label,
              "sentence1": "Two women are embracing while holding to go packages.",
              "sentence1_binary_parse": "( ( Two women ) ( ( are embracing ) . ) )",
              "sentence2": "The sisters are hugging goodbye.",
              "sentence2_binary_parse": "( ( The sisters ) ( ( are ( hugging goodbye ) ) . ) )"}
    record.update(fields)
    return json.dumps({k: v for k, v in record.items() if v is not None})


SNLI_TXT_HEADER = ("gold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
                   "sentence2_parse\tsentence1\tsentence2\tcaptionID\tpairID\tlabel1\tlabel2\t"
                   "label3\tlabel4\tlabel5")


def snli_txt(label: str = "neutral") -> str:
    return "\t".join([label, "( ( Two women ) ( are embracing ) )", "( The ( sisters hug ) )",
                      "(ROOT (S (NP (CD Two) (NNS women))))", "(ROOT (NP (DT The) (NNS sisters)))",
                      "Two women are embracing", "The sisters hug", "4705552913.jpg#2",
                      "4705552913.jpg#2r1n", label, "entailment", "neutral", "neutral",
                      "neutral"])


GLUE_MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
                    "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\t"
                    "sentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")


def glue_mnli(label: str = "neutral") -> str:
    return "\t".join(["0", "63735", "63735n", "slate", "( ( The ( new rights ) ) ( are nice ) )",
                      "( Everyone ( likes ( the benefits ) ) )", "(ROOT (S (NP (DT The))))",
                      "(ROOT (S (NP (NN Everyone))))", "The new rights are nice",
                      "Everyone likes the benefits", label, label, label, label, label, label])


SCITAIL_TSV = ["An introduction to atoms and elements.\tAtoms make up elements.\tneutral",
               "Wavelength is the distance between two points.\tWavelength is a distance.\tentails"]


def dnli(n: int = 1, label: str = "positive", **fields) -> dict:
    record = {"id": f"dev_{n}", "dtype": "have_x", "label": label,
              "sentence1": "i have a bike at home .", "sentence2": "i own a bike ."}
    record.update(fields)
    return {k: v for k, v in record.items() if v is not None}


DNLI = json.dumps([dnli(1), dnli(2, "negative")])
SST_TREES = ["(3 (2 It) (4 (2 's) (4 (3 (2 a) (4 lovely)) (2 film))))",
             "(1 (2 (1 No) (2 one)) (1 (2 goes) (2 .)))"]
SST2 = ["sentence\tlabel", "the expressive power of the camera \t1", "well-conceived \t1"]
LINZEN = ["VBP\tsince NNP models", "VBZ\tthe type and only species"]
LM1B = ["The U.S. Centers for Disease Control and Prevention initially advised school systems",
        "When I was a kid , I liked football ."]
MLU = ["y=691,x=-999,y*x:-690309", "y=210,x=-995,y+x:-785"]
IWSLT_EN = ["How can I speak in 10 minutes about the bonds of women ?",
            "This is not a finished story ."]
IWSLT_VI = ["Làm sao tôi có thể trình bày trong 10 phút ?", "Đây không phải là một câu chuyện "
            "đã kết thúc ."]
STANFORD_VOCAB = ["<unk>", "<s>", "</s>", "Rachel", ":"]
SGML = ['<srcset setid="newstest2014" srclang="any">',
        '<doc docid="10023-schwarzwaelder-bote.de" genre="news" origlang="de">',
        '<seg id="1">Gutach: Increased safety for pedestrians</seg>',
        '<seg id="2">They are not even 100 metres apart.</seg>',
        "</doc>", "</srcset>"]
WMT_EN = ["Resumption of the session", "I declare resumed the session ."]
WMT_DE = ["Wiederaufnahme der Sitzungsperiode", "Ich erkläre die Sitzung für wiederaufgenommen ."]


def algolisp(**fields) -> str:
    record = {"funcs": [], "text": ["given", "a", "number", "a", ",", "find", "a", "+", "1"],
              "short_tree": ["invoke1", ["lambda1", ["+", "arg1", "1"]], "a"],
              "args": {"a": "int"}, "return_type": "int", "tags": [], "nodes": ["+"]}
    record.update(fields)
    return json.dumps({k: v for k, v in record.items() if v is not None})


WIKIQA_FILTERED = {"a.toks": ["how big is bmc software in houston , tx"] * 2,
                   "b.toks": ["bmc software , inc. is an american company .",
                              "headquartered in houston , texas , bmc develops software ."],
                   "sim.txt": ["1", "0"], "id.txt": ["2", "2"]}
WIKIQA_TSV_HEADER = "QuestionID\tQuestion\tDocumentID\tDocumentTitle\tSentenceID\tSentence\tLabel"


def wikiqa_tsv(label: str = "0", sentence: str = "African immigration refers to immigrants .") \
        -> str:
    return "\t".join(["Q0", "HOW AFRICAN AMERICANS WERE IMMIGRATED TO THE US", "D0",
                      "African immigration to the United States", "D0-0", sentence, label])


TRECQA = ["<QApairs id='1.4'>", "<question>", "What\tethnic\tgroup\tare\tCrip\tmembers\t?",
          "WP\tJJ\tNN\tVBP\tJJ\tNNS\t.", "</question>", "<negative>",
          "Prison\tgangs\thave\ta\tnegotiation\tsystem\t.", "NNP\tNNS\tVBP\tDT\tNN\tNN\t.",
          "</negative>", "<positive>", "Crips\tare\tblack\t.", "NNP\tVBP\tJJ\t.", "</positive>",
          "</QApairs>"]
UBUNTU_EVAL_HEADER = ("Context,Ground Truth Utterance," +
                      ",".join(f"Distractor_{i}" for i in range(9)))
UBUNTU_EVAL_ROW = ('"anyon know whi my stock oneir export env var usernam ? __eou__ __eot__",'
                   + ",".join(f"answer {i} __eou__" for i in range(10)))
UBUNTU_TRAIN = ["Context,Utterance,Label",
                '"i think we could import the old comment via rsync __eou__ __eot__",'
                '"basic each xfree86 upload will not forc user to upgrad __eou__",1']
GLOVE = ["the 0.1 0.2 0.3", "film -0.5 0.25 1e-3"]


def lines(*rows: str) -> str:
    return "".join(row + "\n" for row in rows)


# ----------------------------------------------------------------------------- the readers

@dataclass(frozen=True)
class Reader:
    """A reader as its DataModule calls it: ``read(path)`` reads the file at ``path`` (and
    the other files of its format, ``companions``, beside it) to the end.

    ``valid``: the lines of a valid file (for a line-aligned format, two, as each
    companion has).  ``what``: the file as the reader names it in its errors; ``missing``:
    the message of a missing file when the reader asks for it first (else the shared
    reader's :class:`MissingDataFile`)."""

    name: str
    file: str
    valid: list[str]
    read: Callable[[Path], object]
    companions: dict[str, list[str]] = field(default_factory=dict)
    what: str = "a file"
    missing: str | None = None


def _wmt_train(path: Path) -> list:
    return list(WMT14DataModule(str(path.parent)).split_text("train").pairs)


READERS = [
    Reader("snli_jsonl", "snli_1.0_dev.jsonl", [snli(), snli("contradiction")],
           lambda p: list(read_nli(p, "jsonl"))),
    Reader("snli_txt", "snli_1.0_dev.txt", [SNLI_TXT_HEADER, snli_txt()],
           lambda p: list(read_nli(p, "txt"))),
    Reader("glue_mnli_tsv", "dev_matched.tsv", [GLUE_MNLI_HEADER, glue_mnli()],
           lambda p: list(read_nli(p, "txt"))),
    Reader("scitail_tsv", "scitail_1.0_dev.tsv", SCITAIL_TSV,
           lambda p: list(read_scitail_tsv(p))),
    Reader("scitail_snli", "scitail_1.0_dev.txt", [snli(), snli("entailment")],
           lambda p: list(read_nli(p, "jsonl", SCITAIL_SNLI_LABELS))),
    Reader("dnli", "dialogue_nli_dev.jsonl", [DNLI], lambda p: list(read_dialogue_nli(p))),
    Reader("sst_ptb", "dev.txt", SST_TREES, read_sst_ptb),
    Reader("sst2_glue", "dev.tsv", SST2, read_glue_sst2),
    Reader("imdb", "0_9.txt", ["A lovely film.<br /><br />The best."],
           lambda p: read_review(p, "pos"), what="a review file"),
    Reader("sva", "numpred.val", LINZEN, read_linzen),
    Reader("lm1b", "news.en.heldout-00000-of-00050", LM1B,
           lambda p: list(read_sentences([p]))),
    Reader("mlu", "examples.txt", MLU, read_problems, what="a problem file",
           missing="MLU problem file not found at {path}"),
    Reader("iwslt", "tst2012.en", IWSLT_EN,
           lambda p: list(read_parallel_lines(p, p.with_name("tst2012.vi"))),
           companions={"tst2012.vi": IWSLT_VI}),
    Reader("stanford_vocab", "vocab.en", STANFORD_VOCAB, read_stanford_vocab),
    Reader("wmt_sgml", "newstest2014-deen-src.en.sgm", SGML, read_sgml_segments),
    Reader("wmt_train", "train.en", WMT_EN, _wmt_train, companions={"train.de": WMT_DE},
           missing="WMT14DataModule source training text (plain, one sentence per line) not "
                   "found at {path}"),
    Reader("algolisp", "metaset3.dev.jsonl", [algolisp(), algolisp()], read_algolisp),
    Reader("wikiqa_filtered", "a.toks", WIKIQA_FILTERED["a.toks"],
           lambda p: list(read_wikiqa_filtered(p.parent)),
           companions={k: v for k, v in WIKIQA_FILTERED.items() if k != "a.toks"},
           missing="WikiQA filtered a.toks not found at {path}. " + WIKIQA_FILTERED_HOW),
    Reader("wikiqa_tsv", "WikiQA-dev.tsv", [WIKIQA_TSV_HEADER, wikiqa_tsv()],
           lambda p: list(read_wikiqa_tsv(p, tokenizer="whitespace"))),
    Reader("trecqa", "DEV.xml", TRECQA, lambda p: list(read_trecqa(p))),
    Reader("ubuntu", "valid.csv", [UBUNTU_EVAL_HEADER, UBUNTU_EVAL_ROW],
           lambda p: list(read_ubuntu(p))),
    Reader("glove", "glove.txt", GLOVE, lambda p: list(read_glove(p, dim=3))),
]
BY_NAME = {r.name: r for r in READERS}


def write(tmp_path: Path, reader: Reader, content: str | bytes | None,
          companions: dict[str, str] | None = None) -> Path:
    """The reader's file under ``tmp_path / reader.name`` holding ``content`` (None: the
    valid lines), its companions valid unless ``companions`` says otherwise."""
    folder = tmp_path / reader.name
    folder.mkdir(exist_ok=True)
    for name, rows in reader.companions.items():
        text = (companions or {}).get(name, lines(*rows))
        (folder / name).write_text(text, encoding="utf-8")
    path = folder / reader.file
    content = lines(*reader.valid) if content is None else content
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def fails(reader: Reader, path: Path, exception: type[Exception] = DataFormatError) -> str:
    """The message of the error ``reader`` raises on ``path``."""
    with pytest.raises(exception) as err:
        reader.read(path)
    return str(err.value)


def test_every_valid_file_reads(tmp_path):
    """The valid files of the matrix are valid: each case below spoils one thing only."""
    for reader in READERS:
        assert reader.read(write(tmp_path, reader, None)), reader.name


# ----------------------------------------------------------------------------- every reader:
# bytes that are not UTF-8, a directory, a missing and an unreadable file

@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.name)
def test_undecodable_bytes_name_file_and_line(reader, tmp_path):
    path = write(tmp_path, reader, lines(reader.valid[0]).encode() + BAD_BYTES)
    assert fails(reader, path) == f"{path}:2: expected UTF-8 text, got {repr(BAD_BYTES)!r}"


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.name)
def test_a_directory_in_place_of_the_file(reader, tmp_path):
    path = write(tmp_path, reader, None)
    path.unlink()
    path.mkdir()
    assert fails(reader, path) == f"{path}: expected {reader.what}, not a directory"


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.name)
def test_a_missing_file(reader, tmp_path):
    path = write(tmp_path, reader, None)
    path.unlink()
    message = fails(reader, path, FileNotFoundError)
    if reader.missing is not None:  # the reader asks for its file first, saying how to get it
        assert message == reader.missing.format(path=path)
    else:
        assert message == f"{path}: expected {reader.what} (there is none at this path)"
        with pytest.raises(MissingDataFile):  # a DataFormatError too: one line from a command
            reader.read(path)


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.name)
def test_an_unreadable_file(reader, tmp_path, monkeypatch):
    """Tests run as root, whom permissions do not stop: the shared reader's ``open`` is made
    to refuse the file as the system would refuse another user."""
    path = write(tmp_path, reader, None)
    real_open = open

    def refusing(file, *args, **kwargs):
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(common, "open", refusing, raising=False)
    assert fails(reader, path) == (f"{path}: expected {reader.what} this process may read "
                                   "(permission denied)")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads files whatever their permissions")
def test_an_unreadable_file_for_real(tmp_path):
    reader = BY_NAME["sva"]
    path = write(tmp_path, reader, None)
    path.chmod(0)
    assert fails(reader, path) == f"{path}: expected a file this process may read (permission " \
                                  "denied)"


# ----------------------------------------------------------------------------- the cases of
# each format: (reader, case, content of its file, the message; {path} is the file, {dir}
# its folder, and companions may be replaced)

def _json_error(text: str) -> json.JSONDecodeError:
    try:
        json.loads(text)
    except json.JSONDecodeError as err:
        return err
    raise AssertionError(f"valid JSON: {text}")


def _csv_error(text: str) -> str:
    try:
        list(csv.reader(io.StringIO(text), strict=True))
    except csv.Error as err:
        return str(err)
    raise AssertionError(f"valid CSV: {text}")


TRUNCATED_SNLI = snli()[:70]
TRUNCATED_ALGOLISP = algolisp()[:50]
DNLI_CUT = "[" + json.dumps(dnli(1)) + ", " + json.dumps(dnli(2))[:30]
UBUNTU_CUT = UBUNTU_EVAL_HEADER + "\n" + UBUNTU_EVAL_ROW[:40]
SNLI_FIELDS = "gold_label, sentence1_binary_parse, sentence2_binary_parse"
MLU_FORM = "'<x|y>=<int>,<y|x>=<int>,<x|y><+|-|*><x|y>:<int>'"
WIKIQA_TSV_FIELDS = "QuestionID Question DocumentID DocumentTitle SentenceID Sentence Label"
SST_CUT = "(3 (2 It) (4 (2 's)"


def _dnli_cut_message() -> str:
    pos = DNLI_CUT.index("{", 2 + len(json.dumps(dnli(1))))
    try:
        json.JSONDecoder().raw_decode(DNLI_CUT, pos)
    except json.JSONDecodeError as err:
        return f"record 2 in JSON, got '{err.msg} at column {err.colno}'"
    raise AssertionError("the cut record parses")


CASES = [
    # -- SNLI / MultiNLI JSON lines
    ("snli_jsonl", "empty", "", "{path}: expected at least one JSON object line"),
    ("snli_jsonl", "truncated last line", lines(snli()) + TRUNCATED_SNLI,
     f"{{path}}:2: expected a JSON object with string fields {SNLI_FIELDS}, got "
     f"{'invalid JSON (' + _json_error(TRUNCATED_SNLI).msg + ')'!r}"),
    ("snli_jsonl", "missing key", lines(snli(), snli(sentence2_binary_parse=None)),
     f"{{path}}:2: expected a JSON object with string fields {SNLI_FIELDS}, got "
     "'sentence2_binary_parse=None'"),
    ("snli_jsonl", "not an object", lines(snli(), '["neutral"]'),
     f"{{path}}:2: expected a JSON object with string fields {SNLI_FIELDS}, got "
     "'[\"neutral\"]'"),
    ("snli_jsonl", "label", lines(snli(), snli("maybe")),
     "{path}:2: expected a label in entailment | neutral | contradiction | -, got "
     "\"'maybe'\""),
    # -- SNLI / MultiNLI txt
    ("snli_txt", "empty", "", "{path}: expected a tab-separated header row and at least one row"),
    ("snli_txt", "header only", lines(SNLI_TXT_HEADER),
     "{path}: expected at least one row after the header"),
    ("snli_txt", "truncated last line", lines(SNLI_TXT_HEADER, snli_txt()) + "neutral\t( ( Two",
     f"{{path}}:3: expected 3 to 14 tab-separated fields (header: {SNLI_TXT_HEADER}), got "
     "'2 fields'"),
    ("snli_txt", "wrong columns", lines("gold_label\tsentence1\tsentence2", snli_txt()),
     f"{{path}}:1: expected a tab-separated header with columns {SNLI_FIELDS}, got "
     f"{'gold_label' + chr(9) + 'sentence1' + chr(9) + 'sentence2'!r}"),
    ("snli_txt", "label", lines(SNLI_TXT_HEADER, snli_txt("maybe")),
     "{path}:2: expected a label in entailment | neutral | contradiction | -, got "
     "\"'maybe'\""),
    # -- GLUE MNLI tsv (its test files have no gold_label column)
    ("glue_mnli_tsv", "truncated last line",
     lines(GLUE_MNLI_HEADER) + glue_mnli().rsplit("\t", 2)[0],
     f"{{path}}:2: expected 16 to 16 tab-separated fields (header: {GLUE_MNLI_HEADER}), got "
     "'14 fields'"),
    ("glue_mnli_tsv", "wrong columns (a test file)",
     lines(GLUE_MNLI_HEADER.rsplit("\t", 1)[0], glue_mnli().rsplit("\t", 1)[0]),
     f"{{path}}:1: expected a tab-separated header with columns {SNLI_FIELDS}, got "
     f"{GLUE_MNLI_HEADER.rsplit(chr(9), 1)[0][:117] + '...'!r}"),
    ("glue_mnli_tsv", "label", lines(GLUE_MNLI_HEADER, glue_mnli("hidden")),
     "{path}:2: expected a label in entailment | neutral | contradiction | -, got "
     "\"'hidden'\""),
    # -- SciTail tsv_format and snli_format
    ("scitail_tsv", "empty", "",
     "{path}: expected at least one line 'premise<TAB>hypothesis<TAB>entails|neutral'"),
    ("scitail_tsv", "truncated last line", lines(SCITAIL_TSV[0]) + SCITAIL_TSV[1][:60],
     "{path}:2: expected 3 tab-separated fields: premise, hypothesis, entails|neutral, got "
     "'2 fields'"),
    ("scitail_tsv", "wrong columns", lines(SCITAIL_TSV[0], SCITAIL_TSV[1] + "\t0.9"),
     "{path}:2: expected 3 tab-separated fields: premise, hypothesis, entails|neutral, got "
     "'4 fields'"),
    ("scitail_tsv", "label", lines(SCITAIL_TSV[0], SCITAIL_TSV[1][:-7] + "entailment"),
     "{path}:2: expected a label in entails | neutral, got \"'entailment'\""),
    ("scitail_snli", "label", lines(snli(), snli("contradiction")),
     "{path}:2: expected a label in entailment | neutral | -, got \"'contradiction'\""),
    # -- Dialogue NLI
    ("dnli", "empty", "", "{path}: expected a JSON list of records (or one record per line)"),
    ("dnli", "empty list", "[]\n", "{path}: expected at least one record in the JSON list"),
    ("dnli", "truncated", DNLI_CUT, "{path}:1: expected " + _dnli_cut_message()),
    ("dnli", "missing key", json.dumps([dnli(1), dnli(2, sentence2=None)]),
     "{path}:1: expected record 2 with string fields label, sentence1, sentence2, got "
     f"{json.dumps(dnli(2, sentence2=None))!r}"),
    ("dnli", "label", json.dumps([dnli(1), dnli(2, "entailment")]),
     "{path}:1: expected record 2 with label in positive | neutral | negative, got "
     "\"'entailment'\""),
    # -- SST PTB trees
    ("sst_ptb", "empty", "", "{path}: expected at least one tree (one per line)"),
    ("sst_ptb", "truncated last line", lines(SST_TREES[0]) + SST_CUT,
     f"{{path}}:2: expected balanced parentheses (2 '(' left open), got {SST_CUT!r}"),
    ("sst_ptb", "not a tree", lines(SST_TREES[0], "It 's a lovely film"),
     "{path}:2: expected a tree starting with '(' (found 'It' outside any node), got "
     "\"It 's a lovely film\""),
    ("sst_ptb", "label", lines(SST_TREES[0], "(5 (2 It) (4 good))"),
     "{path}:2: expected a sentiment label 0-4 after '(' (token 2 is '5'), got "
     "'(5 (2 It) (4 good))'"),
    # -- GLUE SST-2
    ("sst2_glue", "empty", "",
     "{path}: expected the header 'sentence\\tlabel' and at least one row"),
    ("sst2_glue", "truncated last line", lines(*SST2[:2]) + "well-conceived",
     "{path}:3: expected 'sentence<TAB>label' (2 fields), got 'well-conceived'"),
    ("sst2_glue", "wrong columns (the test file)", lines("index\tsentence", "0\tuneasy mishmash"),
     "{path}:1: expected the header 'sentence\\tlabel' (GLUE's test.tsv has no labels and "
     "cannot be read), got 'index\\tsentence'"),
    ("sst2_glue", "label", lines(*SST2[:2], "well-conceived \t2"),
     "{path}:3: expected label 0 or 1, got '2'"),
    # -- IMDb (a review per file: the file name carries the rating)
    ("imdb", "empty", "", "{path}: expected a non-empty review"),
    ("imdb", "only markup", "<br /><br />", "{path}: expected a non-empty review"),
    # -- SVA (Linzen et al.)
    ("sva", "empty", "", "{path}: expected at least one line 'VBZ|VBP<TAB>prefix'"),
    ("sva", "truncated last line", lines(LINZEN[0]) + "VBZ",
     "{path}:2: expected 'VBZ|VBP<TAB>prefix' (2 fields), got 'VBZ'"),
    ("sva", "wrong columns", lines(LINZEN[0], LINZEN[1] + "\tVBZ"),
     "{path}:2: expected 'VBZ|VBP<TAB>prefix' (2 fields), got "
     "'VBZ\\tthe type and only species\\tVBZ'"),
    ("sva", "label", lines(LINZEN[0], "VBD\tthe dog"),
     "{path}:2: expected verb tag VBZ or VBP, got 'VBD'"),
    # -- One Billion Word
    ("lm1b", "empty", "", "{path}: expected at least one sentence (one per line)"),
    ("lm1b", "blank lines only", "\n \n", "{path}: expected at least one sentence (one per line)"),
    # -- MLU
    ("mlu", "empty", "", "{path}: expected at least one problem line"),
    ("mlu", "truncated last line", lines(MLU[0]) + "y=210,x=-995,y+",
     f"{{path}}:2: expected {MLU_FORM}, got 'y=210,x=-995,y+'"),
    ("mlu", "wrong answer", lines(MLU[0], "y=210,x=-995,y+x:-784"),
     "{path}:2: expected answer -785 for 'y=210,x=-995,y+x', got '-784'"),
    ("mlu", "value out of range", lines(MLU[0], "x=5000,y=1,x+y:5001"),
     "{path}:2: expected values in [-1000, 1000), got '5000'"),
    # -- IWSLT'15 (line-aligned plain text) and its Stanford vocabularies
    ("iwslt", "empty", "", "{path}: expected at least one of the lines of a parallel corpus "
     "(it and {dir}/tst2012.vi are empty)", {"tst2012.vi": ""}),
    ("iwslt", "parallel files of different lengths", lines(IWSLT_EN[0]),
     "{path}: expected as many lines as {dir}/tst2012.vi (2 lines: source and target are "
     "aligned by position), got '1 lines'"),
    ("stanford_vocab", "empty", "", "{path}: expected <unk>, <s>, </s> and at least one word"),
    ("stanford_vocab", "truncated (specials only)", lines("<unk>", "<s>", "</s>"),
     "{path}: expected <unk>, <s>, </s> and at least one word"),
    ("stanford_vocab", "wrong first lines", lines("<s>", "<unk>", "</s>", "Rachel"),
     "{path}:1: expected '<unk>' (a Stanford vocab file starts with <unk>, <s>, </s>), got "
     "'<s>'"),
    ("stanford_vocab", "two words on a line", lines(*STANFORD_VOCAB, "New York"),
     "{path}:6: expected one word per line, got 'New York'"),
    ("stanford_vocab", "a word twice", lines(*STANFORD_VOCAB, "Rachel"),
     "{path}:6: expected each word once (ids follow line numbers), got 'Rachel'"),
    # -- WMT SGML and training text
    ("wmt_sgml", "empty", "", "{path}: expected at least one <seg> line (a WMT SGML file)"),
    ("wmt_sgml", "truncated last line", lines(*SGML[:3]) + '<seg id="2">They are not even',
     "{path}:4: expected one whole <seg id=\"N\">text</seg> per line, got "
     "'<seg id=\"2\">They are not even'"),
    ("wmt_train", "empty", "", "{path}: expected at least one of the lines of a parallel "
     "corpus (it and {dir}/train.de are empty)", {"train.de": ""}),
    ("wmt_train", "parallel files of different lengths", lines(*WMT_EN, "One more ."),
     "{path}: expected as many lines as {dir}/train.de (2 lines: source and target are "
     "aligned by position), got '3 lines'"),
    # -- AlgoLisp
    ("algolisp", "empty", "", "{path}: expected at least one AlgoLisp record"),
    ("algolisp", "truncated last line", lines(algolisp()) + TRUNCATED_ALGOLISP,
     "{path}:2: expected a JSON object (an AlgoLisp record), got "
     f"{'invalid JSON (' + _json_error(TRUNCATED_ALGOLISP).msg + ')'!r}"),
    ("algolisp", "missing key", lines(algolisp(), algolisp(short_tree=None)),
     "{path}:2: expected \"short_tree\": a non-empty nested list of strings (the program), "
     "got 'None'"),
    # -- WikiQA filtered (four line-aligned files) and tsv
    ("wikiqa_filtered", "empty", "",
     "{dir}: expected line-aligned a.toks, b.toks, sim.txt, id.txt with at least one line",
     {"b.toks": "", "sim.txt": "", "id.txt": ""}),
    ("wikiqa_filtered", "parallel files of different lengths", None,
     "{dir}/sim.txt:2: expected line 2, as in a.toks (a.toks, b.toks, sim.txt, id.txt are "
     "line-aligned), got 'end of file after 1 lines'", {"sim.txt": "1\n"}),
    ("wikiqa_filtered", "label", None, "{dir}/sim.txt:2: expected a label 0 | 1, got \"'2'\"",
     {"sim.txt": "1\n2\n"}),
    ("wikiqa_filtered", "missing question id", None,
     "{dir}/id.txt:2: expected a question id, got \"' '\"", {"id.txt": "2\n \n"}),
    ("wikiqa_tsv", "empty", "", f"{{path}}: expected the tab-separated header {WIKIQA_TSV_FIELDS} "
     "and at least one row"),
    ("wikiqa_tsv", "header only", lines(WIKIQA_TSV_HEADER),
     "{path}: expected at least one row after the header"),
    ("wikiqa_tsv", "truncated last line",
     lines(WIKIQA_TSV_HEADER) + wikiqa_tsv().rsplit("\t", 1)[0],
     f"{{path}}:2: expected 7 tab-separated fields ({WIKIQA_TSV_FIELDS}), got '6 fields'"),
    ("wikiqa_tsv", "wrong columns", lines(WIKIQA_TSV_HEADER.replace("Label", "Score"),
                                          wikiqa_tsv()),
     f"{{path}}:1: expected the tab-separated header {WIKIQA_TSV_FIELDS}, got "
     f"{WIKIQA_TSV_HEADER.replace('Label', 'Score')!r}"),
    ("wikiqa_tsv", "label", lines(WIKIQA_TSV_HEADER, wikiqa_tsv("2")),
     "{path}:2: expected a label 0 | 1, got \"'2'\""),
    # -- TrecQA (jacana pseudo-XML)
    ("trecqa", "empty", "", "{path}: expected at least one <QApairs> block"),
    ("trecqa", "truncated", lines(*TRECQA[:7]),
     "{path}:6: expected </negative> closing this <negative>, got 'end of file'"),
    ("trecqa", "label (a tag outside the set)",
     lines(*TRECQA[:9], "<maybe>", *TRECQA[10:]),
     "{path}:10: expected a <QApairs>, </QApairs>, <question>, <positive> or <negative> tag in "
     "the <QApairs> block of line 1, got '<maybe>'"),
    # -- Ubuntu Dialogue Corpus v2 CSV
    ("ubuntu", "empty", "", "{path}: expected a CSV header row and at least one row"),
    ("ubuntu", "header only", lines(UBUNTU_EVAL_HEADER),
     "{path}: expected at least one row after the header"),
    ("ubuntu", "truncated last line", UBUNTU_CUT,
     f"{{path}}:2: expected CSV records, got {_csv_error(UBUNTU_CUT)!r}"),
    ("ubuntu", "wrong columns", lines(UBUNTU_EVAL_HEADER, UBUNTU_EVAL_ROW + ",extra"),
     f"{{path}}:2: expected 11 comma-separated fields ({UBUNTU_EVAL_HEADER}), got '12 fields'"),
    ("ubuntu", "label", lines(UBUNTU_TRAIN[0], UBUNTU_TRAIN[1][:-1] + "2"),
     "{path}:2: expected a label 0 | 1 | 0.0 | 1.0, got \"'2'\""),
    # -- GloVe
    ("glove", "empty", "",
     "{path}: expected at least one line: a word followed by 3 space-separated numbers"),
    ("glove", "truncated last line", lines(GLOVE[0]) + "film -0.5 0.",
     "{path}:2: expected a word followed by 3 space-separated numbers, got "
     "'2 numbers: film -0.5 0.'"),
    ("glove", "wrong dimension", lines("2 300", *GLOVE),
     "{path}:1: expected vectors of dimension 3, got '2 300'"),
    ("glove", "a number that is not one", lines(GLOVE[0], "film -0.5 0.25 x"),
     "{path}:2: expected a word followed by 3 space-separated numbers, got "
     "'film -0.5 0.25 x'"),
]


@pytest.mark.parametrize("name, case, content, message, companions",
                         [(*c, None) if len(c) == 4 else c for c in CASES],
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_file_names_file_line_and_expectation(name, case, content, message, companions,
                                                  tmp_path):
    reader = BY_NAME[name]
    path = write(tmp_path, reader, content, companions)
    assert fails(reader, path) == message.replace("{path}", str(path)).replace(
        "{dir}", str(path.parent))


def test_every_reader_meets_an_empty_file():
    """The matrix covers every reader, and each (but the variants of a reader tried above:
    SciTail's snli_format and GLUE's MNLI tsv are SNLI's readers) with an empty file."""
    cases: dict[str, set[str]] = {}
    for name, case, *_ in CASES:
        cases.setdefault(name, set()).add(case)
    assert set(cases) == set(BY_NAME)
    assert {name for name, seen in cases.items() if "empty" not in seen} == {
        "scitail_snli", "glue_mnli_tsv"}


def test_parallel_sgml_segments_must_pair_up(tmp_path):
    src = tmp_path / "newstest2014-deen-src.en.sgm"
    ref = tmp_path / "newstest2014-deen-ref.de.sgm"
    src.write_text(lines(*SGML), encoding="utf-8")
    ref.write_text(lines(*SGML[:3], *SGML[4:]), encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        read_text_pairs(src, ref)
    assert str(err.value) == (f"{src}: expected as many segments as {ref} (1 segments: source "
                              "and target are aligned by position), got '2 segments'")
    ref.write_text(lines(*SGML).replace('id="2"', 'id="7"'), encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        read_text_pairs(src, ref)
    assert str(err.value) == (f"{ref}:4: expected the segment of {src}:4 (docid "
                              "'10023-schwarzwaelder-bote.de', seg id '2'), got "
                              "\"docid '10023-schwarzwaelder-bote.de', seg id '7'\"")
    plain = tmp_path / "dev.de"
    plain.write_text(lines(*WMT_DE), encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        read_text_pairs(src, plain)
    assert str(err.value) == (f"{src}: expected the format of {plain}: both SGML (.sgm) or "
                              "both plain text")


def test_imdb_file_names_ratings_and_folders(tmp_path):
    pos = tmp_path / "train" / "pos"
    pos.mkdir(parents=True)
    (tmp_path / "train" / "neg").write_text("not a folder")
    review = pos / "review.txt"
    review.write_text("A lovely film.")
    with pytest.raises(DataFormatError) as err:
        read_review(review, "pos")
    assert str(err.value) == (f"{review}: expected a review file named <id>_<rating>.txt, got "
                              "'review.txt'")
    review = review.rename(pos / "3_5.txt")  # a rating outside pos/'s 7-10
    with pytest.raises(DataFormatError) as err:
        read_review(review, "pos")
    assert str(err.value) == f"{review}: expected a rating 7-10 in pos/, got '5'"
    with pytest.raises(DataFormatError) as err:
        read_aclimdb(tmp_path, "train")
    assert str(err.value) == (f"{tmp_path / 'train' / 'neg'}: expected a folder of review files, "
                              "not a file")


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


def write_iwslt(folder: Path, val: tuple[str, str] | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, sentences in (("en", IWSLT_EN), ("vi", IWSLT_VI)):
        words = sorted({w for s in sentences for w in s.split()})
        (folder / f"vocab.{lang}").write_text(lines(*STANFORD_VOCAB[:3], *words))
        (folder / f"train.{lang}").write_text(lines(*sentences))
        (folder / f"tst2012.{lang}").write_text(lines(*sentences))
    if val is not None:
        (folder / "tst2012.en").write_text(val[0])
        (folder / "tst2012.vi").write_text(val[1])


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
        dwin_classification.EXPERIMENT.main([
            "fit", "--config", "experiments/configs/dwin_classification/smoke.yaml", "--config",
            "experiments/configs/dwin_classification/smoke/sva.yaml", "--data.data_dir",
            str(tmp_path), "--data.train_file", "numpred.train", "--data.val_file",
            "numpred.train", "--data.test_file", "numpred.train"])
