"""Rare-word analysis of decoded translations: Table 4 of the quantum-statistics attention paper
(Charalampous & Chatzis, "Quantum Statistics-Inspired Neural Attention", Sec. 5.1, "Rare word
mean reference frequency deviation"), after Ott et al. 2018 ("Analyzing uncertainty in neural
machine translation", the paper's [19]).

What the paper says (Sec. 5.1, all of it): "we present deviation from unigram word
distributions (across 1 - 30% frequency groups). Table 4 reveals how well our evaluated models
estimate said frequencies. Words are split into groups based on their appearance in their
respective training datasets. We present this against development set frequencies. Note that
evaluation criteria include not only deviation but also least over-representation (favored to
any magnitude of under-representation)".  Table 4 gives, per language pair, one "Mean
reference frequency (%)" and, per system, one "Deviation (%)" (e.g. En->Vi: 3.59; baseline
-4.82, structured attention 11.57, MQT 0.28).

The definition implemented
--------------------------
Let ``T`` be the training text of the target language and ``V`` its word types, ``n = |V|``,
``c_T(w)`` the count of ``w`` in ``T``.  Order ``V`` by increasing count (the rarest first;
words of equal count in code-point order): ``w_1, ..., w_n``.  The frequency percentile group
of ``w_r`` is::

    g(w_r) = ceil(B * r / n)            in {1, ..., B},  B = 100 (--bins)

so group 1 holds the rarest 1% of the training vocabulary and group 100 the most frequent 1%.
For a text ``X`` (the reference ``R``, or a system's output ``S``) of ``N_X`` tokens, the
frequency of group ``p`` is the share of ``X``'s tokens in it, in percent::

    F_X(p) = 100 * #{tokens x of X : g(x) = p} / N_X

(a token that is not a training word belongs to no group but counts in ``N_X``).  Over the
groups ``P = {1, ..., 30}`` (--groups 1-30), ``P'`` those of them holding at least one
training word (all 30 once ``n >= 100``)::

    mean frequency      Fbar_X = (1 / |P'|) * sum_{p in P'} F_X(p)
    Table 4             mean reference frequency = Fbar_R
                        deviation of system S    = 100 * (Fbar_S - Fbar_R) / Fbar_R

A positive deviation is over-representation of rare words, a negative one under-representation.
Per group, ``F_X(p)`` and ``100 * (F_S(p) - F_R(p)) / F_R(p)`` (None where ``F_R(p) = 0``) are
in the ``--json`` output.

Where the paper is ambiguous, and what is chosen here
-----------------------------------------------------
1. Which end "1 - 30%" counts from.  A word's frequency percentile is the share of the
   vocabulary at most as frequent as it, so the 1st-30th percentiles are the rarest 30% of
   the training words: what the table's title ("Rare word") and the section (infrequent
   words) are about.  ``--order frequent`` counts from the most frequent words instead.
2. What a group is.  Not given: here 1% of the training vocabulary each, by frequency rank
   (Ott et al.'s percentile groups); the paper's wording also allows other group widths.
   Words of equal count (the hapaxes alone are a large share of a vocabulary) are ordered by
   code point, so a group boundary may cut through them; only the boundary at 30% moves the
   table's numbers, since (3) makes the deviation depend on the union of the groups alone.
3. "Mean ... deviation".  The table has one mean reference frequency per pair and one
   deviation per system, so the deviation is taken of the mean frequency, relative to the
   mean reference frequency (equivalently, of the share of all tokens in groups 1-30), not
   the mean of per-group deviations (undefined for a group absent from the reference).
4. Relative or absolute.  In percent of the reference frequency: the paper's Vi->En -20.85
   against a mean reference frequency of 8.91 cannot be percentage points of it.
5. "Against development set frequencies": the reference is the development set's (the
   command scores the reference it is given; the paper used the dev set).
6. Words.  The tokens of the text as given, separated by ASCII spaces, case kept: the
   references' form of the translation DataModules (the Stanford tokens for IWSLT'15, Moses
   tokens with BPE merged back for WMT'16).  The training text must be tokenized the same way:
   ``--moses LANG`` tokenizes a raw training file as the WMT DataModules do
   (:func:`datamodules.translation.moses_tokenize_train`); or pass their tokenized cache file.
7. Frequency of what.  "Unigram word distributions": shares of tokens, as above.  Another
   reading, the share of a group's word types that occur in the text, is not implemented.

The paper's mean reference frequencies (3.59-8.91%) are not reproduced by either end: over 30
disjoint groups of the most frequent words the mean is at most 100/30 = 3.33% (2.7% with
``--order frequent`` on the shared IWSLT'15 sample, the first 1,000 training lines and
tst2012), and the rarest groups hold a fraction of a percent each (0.08% there).  Compare
deviations (signs and sizes), not the reference frequency.

Inputs: the training target text (plain text, one sentence per line), the reference (plain
text) and hypothesis files, each plain text one sentence per line or the ``.jsonl`` decoded
output of :func:`lit_models.bleu.write_hypotheses` (``hypotheses-<stage>.jsonl``: fields
``hypothesis`` and ``reference``, put back in file order by ``id``; without ``--references``
the references are those of the ``.jsonl`` files, which must agree).

    python -m experiments.rare_words --train train.vi --hypotheses a.jsonl b.txt \\
        [--references ref.vi] [--names baseline mqt] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from datamodules.common import DataFormatError, json_records, read_lines
from datamodules.text import split_tokens

#: the frequency percentile groups of Table 4 ("across 1 - 30% frequency groups")
TABLE4_GROUPS = range(1, 31)
ORDERS = ("rare", "frequent")


# ---------------------------------------------------------------------------------------
# frequency groups


def training_counts(path: str | Path, tokenize: Callable[[str], list[str]] | None = None
                    ) -> Counter:
    """The word counts of a training text, one sentence per line (``tokenize``: a line ->
    its words; default: the tokens between ASCII spaces)."""
    path = _existing(path, "training text")
    counts: Counter = Counter()
    lines = 0
    for _, line in read_lines(path):
        lines += 1
        counts.update(tokenize(line) if tokenize else split_tokens(line))
    if not lines:
        raise DataFormatError(path, None, "a training text of one sentence per line, got an "
                              "empty file")
    if not counts:
        raise DataFormatError(path, None, "at least one word in the training text")
    return counts


def frequency_groups(counts: Counter | dict[str, int], bins: int = 100,
                     order: str = "rare") -> dict[str, int]:
    """word -> its frequency percentile group, 1..``bins`` (see the module docstring):
    ``order`` "rare" puts the rarest words in group 1, "frequent" the most frequent."""
    if bins < 1:
        raise ValueError(f"bins must be positive, got {bins}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    words = [w for w, c in counts.items() if c > 0]
    if not words:
        raise ValueError("no training words to group")
    sign = 1 if order == "rare" else -1
    words.sort(key=lambda w: (sign * counts[w], w))
    n = len(words)
    return {w: -(-bins * r // n) for r, w in enumerate(words, 1)}  # ceil(bins * r / n)


def group_shares(sentences: Iterable[str], groups: dict[str, int], bins: int
                 ) -> tuple[list[float], int]:
    """(F(1), ..., F(bins)) of a text: the percentage of its tokens in each group; and its
    number of tokens."""
    hits = [0] * (bins + 1)
    tokens = 0
    for sentence in sentences:
        for word in split_tokens(sentence):
            tokens += 1
            hits[groups.get(word, 0)] += 1
    shares = [100 * h / tokens if tokens else 0.0 for h in hits[1:]]
    return shares, tokens


def rare_word_deviation(groups: dict[str, int], references: Sequence[str],
                        systems: dict[str, Sequence[str]], selected: Iterable[int] = TABLE4_GROUPS,
                        bins: int = 100) -> dict[str, Any]:
    """Table 4 for one language pair: the reference's and each system's group frequencies
    and mean frequency over the ``selected`` groups (those holding training words), and each
    system's deviation in percent (see the module docstring).  ``systems``: name -> one
    hypothesis per reference."""
    selected = sorted(set(selected))
    if not selected or selected[0] < 1 or selected[-1] > bins:
        raise ValueError(f"groups must lie in 1..{bins}, got {selected}")
    occupied = set(groups.values())
    used = [p for p in selected if p in occupied]
    if not used:
        raise ValueError(f"none of the groups {_span(selected)} holds a training word")
    ref_shares, ref_tokens = group_shares(references, groups, bins)
    if not ref_tokens:
        raise ValueError("the references have no words")
    ref_mean = sum(ref_shares[p - 1] for p in used) / len(used)
    result: dict[str, Any] = {
        "groups": used, "bins": bins, "vocabulary": len(groups),
        "reference": {"tokens": ref_tokens, "mean_frequency": ref_mean,
                      "frequencies": [ref_shares[p - 1] for p in used]},
        "systems": {}}
    for name, hypotheses in systems.items():
        if len(hypotheses) != len(references):
            raise ValueError(f"system {name!r}: {len(hypotheses)} hypotheses for "
                             f"{len(references)} references")
        shares, tokens = group_shares(hypotheses, groups, bins)
        mean = sum(shares[p - 1] for p in used) / len(used)
        result["systems"][name] = {
            "tokens": tokens, "mean_frequency": mean,
            "deviation": _relative(mean, ref_mean),
            "frequencies": [shares[p - 1] for p in used],
            "group_deviations": [_relative(shares[p - 1], ref_shares[p - 1]) for p in used]}
    return result


def _relative(value: float, reference: float) -> float | None:
    return None if reference == 0 else 100 * (value - reference) / reference


def _span(groups: Sequence[int]) -> str:
    return f"{groups[0]}-{groups[-1]}" if groups == list(range(groups[0], groups[-1] + 1)) \
        else ",".join(map(str, groups))


# ---------------------------------------------------------------------------------------
# files


def _existing(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def read_text_lines(path: str | Path, what: str) -> list[str]:
    """The lines of a plain text file, one sentence each (a last line without a newline
    counts); an empty file is an error."""
    path = _existing(path, what)
    lines = [line for _, line in read_lines(path)]
    if not lines:
        raise DataFormatError(path, None, f"a {what} of one sentence per line, got an empty file")
    return lines


def read_jsonl(path: str | Path) -> tuple[list[str], list[str], list[int]]:
    """(hypotheses, references, line numbers) of a ``hypotheses-<stage>.jsonl`` file
    (:func:`lit_models.bleu.write_hypotheses`), in the order of the examples' ``id`` when
    every record has an integer id (the file is in batch order), else in file order.  Blank
    lines are skipped."""
    path = _existing(path, "hypothesis file")
    records = []
    expected = 'a JSON object with string fields "hypothesis" and "reference"'
    for number, line, record in json_records(path, expected):
        if not (isinstance(record.get("hypothesis"), str)
                and isinstance(record.get("reference"), str)):
            raise DataFormatError(path, number, expected, line)
        records.append((record.get("id"), number, record["hypothesis"], record["reference"]))
    if not records:
        raise DataFormatError(path, None, "one JSON record per decoded example, got an empty "
                              "file")
    ids = [r[0] for r in records]
    if all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        first: dict[int, int] = {}
        for i, number, _, _ in records:
            if i in first:
                raise DataFormatError(path, number, f"each id once (id {i} is also on line "
                                      f"{first[i]})")
            first[i] = number
        records.sort(key=lambda r: r[0])
    return [r[2] for r in records], [r[3] for r in records], [r[1] for r in records]


def check_counts(path: Path, sentences: list[str], reference: str, n_ref: int,
                 jsonl: bool = False) -> None:
    """A DataFormatError when a file has another number of sentences than the references,
    naming the file and, for plain text, the first line without a partner."""
    n = len(sentences)
    expected = f"one sentence per reference, {n_ref} as {reference} has"
    if jsonl and n != n_ref:
        raise DataFormatError(path, None, expected, f"{n} records")
    if n < n_ref:
        raise DataFormatError(path, n + 1, expected, f"end of file after {n} lines")
    if n > n_ref:
        raise DataFormatError(path, n_ref + 1, expected,
                              f"{n - n_ref} more lines: {sentences[n_ref]!r}")


def read_systems(hypotheses: Sequence[str | Path], references: str | Path | None = None
                 ) -> tuple[list[str], dict[Path, list[str]]]:
    """(references, {hypothesis file: its hypotheses in reference order}).  ``.jsonl`` files
    are decoded output (:func:`read_jsonl`), anything else plain text.  The references are
    ``references`` when given, else those of the first ``.jsonl`` file; the references of
    every ``.jsonl`` file must equal them (as tokens), and every file must have one
    hypothesis per reference."""
    paths = [Path(p) for p in hypotheses]
    if not paths:
        raise ValueError("no hypothesis files")
    for path in paths:
        _existing(path, "hypothesis file")
    read: dict[Path, tuple[list[str], list[str] | None, list[int] | None]] = {}
    for path in paths:
        if path.suffix == ".jsonl":
            read[path] = read_jsonl(path)
        else:
            lines = read_text_lines(path, "hypothesis file")
            read[path] = (lines, None, None)
    if references is not None:
        ref_path = Path(references)
        refs = read_text_lines(ref_path, "reference file")
        ref_lines = list(range(1, len(refs) + 1))
    else:
        with_refs = [p for p in paths if read[p][1] is not None]
        if not with_refs:
            raise ValueError("plain-text hypotheses need --references (only .jsonl files "
                             "carry their references)")
        ref_path = with_refs[0]
        refs, ref_lines = read[ref_path][1], read[ref_path][2]
    out: dict[Path, list[str]] = {}
    for path in paths:
        hyps, own_refs, numbers = read[path]
        check_counts(path, hyps, str(ref_path), len(refs), jsonl=own_refs is not None)
        if own_refs is not None:
            for i, (mine, theirs) in enumerate(zip(own_refs, refs)):
                if split_tokens(mine) != split_tokens(theirs):
                    raise DataFormatError(path, numbers[i], f"the reference of {ref_path}:"
                                          f"{ref_lines[i]} (both files must decode the same "
                                          f"set, in the same order): {theirs!r}", mine)
        out[path] = hyps
    return refs, out


def system_names(paths: Sequence[Path], names: Sequence[str] | None = None) -> list[str]:
    """``names`` if given (one per file), else each file's stem, or its path where stems
    repeat (``runs/a/hypotheses-test.jsonl`` and ``runs/b/hypotheses-test.jsonl``)."""
    if names is not None:
        if len(names) != len(paths):
            raise ValueError(f"{len(names)} names for {len(paths)} hypothesis files")
        if len(set(names)) != len(names):
            raise ValueError(f"system names must differ, got {list(names)}")
        return list(names)
    stems = [p.stem for p in paths]
    if len(set(stems)) == len(stems):
        return stems
    if len(set(map(str, paths))) != len(paths):
        raise ValueError("a hypothesis file is given twice")
    return [str(p) for p in paths]


def analyse(train: str | Path, hypotheses: Sequence[str | Path],
            references: str | Path | None = None, names: Sequence[str] | None = None,
            groups: Iterable[int] = TABLE4_GROUPS, bins: int = 100, order: str = "rare",
            moses: str | None = None) -> dict[str, Any]:
    """Table 4 of files (see :func:`read_systems` and :func:`rare_word_deviation`), with the
    inputs recorded; ``moses``: Moses-tokenize the training text for that language first."""
    tokenize = None
    if moses:
        from datamodules.translation import moses_tokenize_train

        def tokenize(line: str) -> list[str]:
            return moses_tokenize_train(line, moses)
    paths = [Path(p) for p in hypotheses]
    labels = system_names(paths, names)
    refs, hyps = read_systems(paths, references)
    counts = training_counts(train, tokenize)
    word_groups = frequency_groups(counts, bins, order)
    result = rare_word_deviation(word_groups, refs, {n: hyps[p] for n, p in zip(labels, paths)},
                                 groups, bins)
    result.update(train=str(train), training_tokens=sum(counts.values()), order=order,
                  references=str(references) if references is not None else
                  f"{next(p for p in paths if p.suffix == '.jsonl')} (its references)")
    for name, path in zip(labels, paths):
        result["systems"][name]["file"] = str(path)
    return result


# ---------------------------------------------------------------------------------------
# output


def markdown_table(result: dict[str, Any], per_group: bool = False) -> str:
    """The result as a markdown table: the reference and one column per system; rows the mean
    frequency of the groups and the deviation (and, with ``per_group``, each group's
    frequency)."""
    systems = result["systems"]
    groups = result["groups"]
    end = "rarest" if result.get("order", "rare") == "rare" else "most frequent"
    lines = [f"Rare-word frequency groups {_span(groups)} of {result['bins']} ({end} first) of "
             f"{result['vocabulary']} training words; frequencies in % of each text's tokens.",
             "",
             "| | reference | " + " | ".join(systems) + " |",
             "|---|" + "---:|" * (len(systems) + 1),
             "| mean frequency (%) | " + f"{result['reference']['mean_frequency']:.2f} | "
             + " | ".join(f"{s['mean_frequency']:.2f}" for s in systems.values()) + " |",
             "| deviation (%) | | " + " | ".join(_number(s["deviation"])
                                                for s in systems.values()) + " |"]
    if per_group:
        for i, p in enumerate(groups):
            lines.append(f"| group {p} (%) | {result['reference']['frequencies'][i]:.2f} | "
                         + " | ".join(f"{s['frequencies'][i]:.2f}" for s in systems.values())
                         + " |")
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:+.2f}"


def parse_groups(text: str) -> list[int]:
    """``"1-30"`` -> [1, ..., 30]; ``"1,5,10-12"`` -> [1, 5, 10, 11, 12]."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"groups: ranges like 1-30 or 1,5,10-12, got "
                                         f"{text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"groups: no group in {text!r}")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m experiments.rare_words",
        description="Rare-word mean reference frequency deviation (quantum-statistics "
                    "attention paper, Table 4) of decoded translations: words grouped by "
                    "their frequency percentile in the training text; per system, the "
                    "deviation of the mean frequency of groups 1-30 from the reference's.")
    p.add_argument("--train", required=True,
                   help="training text of the target language, one sentence per line, "
                        "tokenized as the references (or raw, with --moses)")
    p.add_argument("--hypotheses", nargs="+", required=True,
                   help="decoded output: hypotheses-<stage>.jsonl files or plain text, one "
                        "sentence per line")
    p.add_argument("--references", default=None,
                   help="reference file, one sentence per line (default: the references of "
                        "the .jsonl files)")
    p.add_argument("--names", nargs="+", default=None,
                   help="one name per hypothesis file (default: the file names)")
    p.add_argument("--groups", type=parse_groups, default=list(TABLE4_GROUPS),
                   help="frequency percentile groups to average (default: 1-30)")
    p.add_argument("--bins", type=int, default=100,
                   help="number of frequency groups of the vocabulary (default: 100)")
    p.add_argument("--order", choices=ORDERS, default="rare",
                   help="group 1 holds the rarest (default) or the most frequent words")
    p.add_argument("--moses", metavar="LANG", default=None,
                   help="Moses-tokenize the (raw) training text as the WMT DataModules do")
    p.add_argument("--per-group", action="store_true",
                   help="also print each group's frequency")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    try:
        result = analyse(args.train, args.hypotheses, args.references, args.names,
                         args.groups, args.bins, args.order, args.moses)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(json.dumps(result, indent=1, ensure_ascii=False) if args.json
          else markdown_table(result, args.per_group))

