"""Bad input across every reader (issue 16, item 4): an empty file, a truncated last line,
wrong columns or keys, bytes that are not UTF-8, parallel files of different lengths, a
label outside the label set, a missing file, a directory or an unreadable file in place of a
file.  Each is one error naming the file, the line and what was expected (asserted in full).
What reaches the DataModules is in test_bad_data_datamodules.py, sizes below 1 in
test_bad_data_sizes.py, the commands' one line of error in test_bad_data_commands.py.

The bad files are written here, in the published formats (their valid lines are the first
lines of the real files, shortened; those the other bad-data tests also write are in
tests/conftest.py); no test needs ../shared/data."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import datamodules.common as common
from datamodules.algolisp import read_algolisp
from datamodules.common import DataFormatError, MissingDataFile
from datamodules.glove import read_glove
from datamodules.imdb import read_aclimdb, read_review
from datamodules.iwslt import read_stanford_vocab
from datamodules.lm1b import read_sentences
from datamodules.mlu import read_problems
from datamodules.nli import SCITAIL_SNLI_LABELS, read_dialogue_nli, read_nli, read_scitail_tsv
from datamodules.ranking import (
    WIKIQA_FILTERED_HOW,
    read_trecqa,
    read_ubuntu,
    read_wikiqa_filtered,
    read_wikiqa_tsv,
)
from datamodules.sst import read_glue_sst2, read_sst_ptb
from datamodules.sva import read_linzen
from datamodules.translation import read_parallel_lines, read_sgml_segments, read_text_pairs
from datamodules.wmt import WMT14DataModule
from tests.conftest import (
    DNLI,
    GLOVE,
    IWSLT_EN,
    IWSLT_VI,
    LINZEN,
    LM1B,
    SST_TREES,
    STANFORD_VOCAB,
    dnli,
    lines,
    snli,
)

BAD_BYTES = b"caf\xe9 au lait\n"  # Latin-1, not UTF-8
pytestmark = pytest.mark.usefixtures("private_cache")


# ----------------------------------------------------------------------------- valid lines
# (SNLI, Dialogue NLI, SST trees, SVA, LM1B, IWSLT, GloVe: tests/conftest.py)

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


SST2 = ["sentence\tlabel", "the expressive power of the camera \t1", "well-conceived \t1"]
MLU = ["y=691,x=-999,y*x:-690309", "y=210,x=-995,y+x:-785"]
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
