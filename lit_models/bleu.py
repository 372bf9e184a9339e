"""BLEU as the translation papers report it, computed by sacreBLEU (one implementation for
every seq2seq model), and the decoded output written beside a run.

Two conventions, one function each:

* :func:`detokenized_bleu`: sacreBLEU's own, on detokenized text with its default ``13a``
  tokenizer -- the comparable number, with its signature
  (``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...``).
* :func:`tokenized_bleu`: what the papers print.  CoDA Table 4 (IWSLT'15 En-Vi) scores the
  Stanford release, which is already tokenized, and Differentiable Window Table 1 reports
  "case-sensitive tokenized BLEU" on WMT'14 En-De: BLEU over the whitespace-separated tokens
  with no further tokenization (sacreBLEU ``tokenize='none'``), as Moses'
  ``multi-bleu.perl`` computes it.  With ``compound_split=True``, the WMT'14 En-De
  convention of tensor2tensor's ``get_ende_bleu.sh`` and fairseq's
  ``compound_split_bleu.sh`` (after GNMT and ConvS2S): before scoring, both scripts run
  ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` over hypotheses and references, so
  "rich-text" counts as the three tokens ``rich ##AT##-##AT## text``.  :func:`split_compounds`
  is that substitution: a hyphen between two non-space characters, matches left to right
  and not overlapping (so ``a-b-c`` -> ``a ##AT##-##AT## b-c``, as perl does).

The one difference from ``multi-bleu.perl``: when some n-gram order has no match at all,
multi-bleu.perl gives 0 and sacreBLEU (default ``smooth:exp``) a small positive score; both
are the same whenever every order from 1 to 4 has a match, as on any real test set.  The
tokenized signature says ``tok:none`` and, with splitting, ``+compound-split``.

:func:`translation_bleu` scores a model's decoded ids against a translation DataModule's
references both ways (the paper's and sacreBLEU's); :func:`write_translation_report` writes
it beside a run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from sacrebleu.metrics import BLEU

from fileio import write_atomic

#: tensor2tensor's get_ende_bleu.sh / fairseq's compound_split_bleu.sh: ``(\S)-(\S)``; perl
#: reads the files as bytes, where only ASCII white space is \s, so the same here
COMPOUND = re.compile(r"([^ \t\n\r\f\v])-([^ \t\n\r\f\v])")
COMPOUND_SPLIT = r"\1 ##AT##-##AT## \2"


class BleuResult(NamedTuple):
    """Corpus BLEU (0-100) with the sacreBLEU signature saying how it was computed."""

    score: float
    signature: str
    precisions: tuple[float, ...]  # modified n-gram precisions, n = 1..4, in percent
    bp: float  # brevity penalty
    sys_len: int  # hypothesis tokens
    ref_len: int  # reference tokens


def detokenized_bleu(hypotheses: Sequence[str], references: Sequence[str],
                     tokenize: str = "13a") -> BleuResult:
    """sacreBLEU corpus BLEU of detokenized ``hypotheses`` against one reference per line,
    tokenized by sacreBLEU (``13a`` by default, as ``sacrebleu`` on the command line)."""
    return _corpus_bleu(hypotheses, references, tokenize)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str],
                   compound_split: bool = False) -> BleuResult:
    """BLEU of pre-tokenized text on its own tokens (sacreBLEU ``tokenize='none'``, as
    multi-bleu.perl); ``compound_split`` first splits hyphenated compounds in both, the
    WMT'14 En-De convention (see the module docstring)."""
    if compound_split:
        hypotheses = [split_compounds(h) for h in hypotheses]
        references = [split_compounds(r) for r in references]
    result = _corpus_bleu(hypotheses, references, "none")
    if compound_split:
        result = result._replace(signature=result.signature.replace(
            "tok:none", "tok:none+compound-split"))
    return result


def split_compounds(line: str) -> str:
    """``rich-text format`` -> ``rich ##AT##-##AT## text format`` (get_ende_bleu.sh)."""
    return COMPOUND.sub(COMPOUND_SPLIT, line)


def _corpus_bleu(hypotheses: Sequence[str], references: Sequence[str],
                 tokenize: str) -> BleuResult:
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"BLEU needs one hypothesis per reference: got {len(hypotheses)} "
                         f"hypotheses and {len(references)} references")
    for name, lines in (("hypothesis", hypotheses), ("reference", references)):
        for i, line in enumerate(lines):
            if not isinstance(line, str) or "\n" in line:
                raise ValueError(f"{name} {i + 1} must be one line of text, got {line!r}")
    metric = BLEU(tokenize=tokenize)
    score = metric.corpus_score(hypotheses, [references])
    return BleuResult(score=score.score, signature=str(metric.get_signature()),
                      precisions=tuple(score.precisions), bp=score.bp, sys_len=score.sys_len,
                      ref_len=score.ref_len)


def write_hypotheses(path: str | Path, ids: Sequence, sources: Sequence[str],
                     hypotheses: Sequence[str], references: Sequence[str],
                     scores: Sequence[float] | None = None) -> Path:
    """Decoded output, one JSON object per line: ``{"id", "source", "hypothesis",
    "reference"}`` and, when given, ``score`` (the hypothesis' beam-search score) in the
    order given (JSON Lines, so tabs and quotes in the text need no escaping rules of their
    own; UTF-8, non-ASCII kept as is)."""
    columns = {"id": ids, "source": sources, "hypothesis": hypotheses, "reference": references}
    if scores is not None:
        columns["score"] = [round(float(s), 6) for s in scores]
    counts = dict(zip(("ids", "sources", "hypotheses", "references", "scores"),
                      map(len, columns.values())))
    if len(set(counts.values())) > 1:
        raise ValueError("write_hypotheses needs one of each per example, got "
                         + ", ".join(f"{n} {name}" for name, n in counts.items()))
    # ids may come as 0-d tensors or numpy integers from a batch
    rows = ([v.item() if hasattr(v, "item") else v for v in row] for row in zip(*columns.values()))
    return write_atomic(path, "".join(json.dumps(dict(zip(columns, row)), ensure_ascii=False)
                                      + "\n" for row in rows))


#: the BLEU a paper reports, as a translation DataModule names it in its ``bleu`` attribute
PAPER_BLEU = ("tokenized", "tokenized+compound_split", "detokenized")


def translation_bleu(datamodule, stage: str, indices: Sequence[int],
                     token_ids: Sequence[Sequence[int]],
                     scores: Sequence[float] | None = None) -> dict:
    """BLEU of decoded target ids against a translation DataModule's references of the
    examples ``indices`` of split ``stage`` (datamodules/translation.py):

    * ``bleu``: the BLEU the paper reports, ``datamodule.bleu``: ``tokenized`` (on the
      references as the DataModule's ``references`` gives them, e.g. the tokenized IWSLT'15
      release), ``tokenized+compound_split`` (WMT'14 En-De) or ``detokenized``;
    * ``sacrebleu``: sacreBLEU's own, ``datamodule.detokenize`` of each hypothesis against
      ``datamodule.raw_references``.

    Returns {"bleu": {...}, "sacrebleu": {...}} (:class:`BleuResult` fields) and
    ``examples`` (id, source, hypothesis, reference and, given ``scores``, the hypothesis'
    score per example, in ``indices`` order)."""
    kind = datamodule.bleu
    if kind not in PAPER_BLEU:
        raise ValueError(f"{type(datamodule).__name__}.bleu must be one of {PAPER_BLEU}, "
                         f"got {kind!r}")
    hypotheses = [datamodule.decode(ids) for ids in token_ids]
    references, raw = datamodule.references(stage), datamodule.raw_references(stage)
    sources = datamodule.sources(stage)
    for i in indices:
        if not 0 <= i < len(references):
            raise ValueError(f"example index {i} outside the {len(references)} {stage} "
                             "references")
    detokenized = [datamodule.detokenize(h) for h in hypotheses]
    raw_refs = [raw[i] for i in indices]
    sacre = detokenized_bleu(detokenized, raw_refs)
    if kind == "detokenized":
        paper = sacre
    else:
        paper = tokenized_bleu(hypotheses, [references[i] for i in indices],
                               compound_split=kind == "tokenized+compound_split")
    return {"bleu": paper._asdict() | {"kind": kind},
            "sacrebleu": sacre._asdict() | {"kind": "detokenized"},
            "examples": {"id": list(indices), "source": [sources[i] for i in indices],
                         "hypothesis": hypotheses,
                         "reference": [references[i] for i in indices],
                         "score": None if scores is None else list(scores)}}


def write_translation_report(run_dir: str | Path, stage: str, report: dict) -> tuple[Path, Path]:
    """``hypotheses-<stage>.jsonl`` (:func:`write_hypotheses`) and ``bleu-<stage>.json``
    (both scores with their signatures) in ``run_dir``."""
    run_dir = Path(run_dir)
    examples = report["examples"]
    hyp_path = write_hypotheses(run_dir / f"hypotheses-{stage}.jsonl", examples["id"],
                                examples["source"], examples["hypothesis"],
                                examples["reference"], examples.get("score"))
    scores = {k: v for k, v in report.items() if k != "examples"} | {
        "examples": len(examples["id"])}
    bleu_path = write_atomic(run_dir / f"bleu-{stage}.json", json.dumps(scores, indent=1) + "\n")
    return hyp_path, bleu_path
