"""AlgoLisp program search (CoDA Table 7): a problem's text to its program, flattened to
tokens, read from tensor2tensor's JSON Lines files by :class:`AlgoLispDataModule` on the
shared machinery of datamodules/translation.py (batches, what evaluation needs)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamodules.common import (
    DataFormatError,
    json_records,
)
from datamodules.text import (
    TextTokenizer,
    build_tokenizer,
)
from datamodules.translation import (
    SplitText,
    TranslationDataModule,
)

# ---------------------------------------------------------------------------------------
# AlgoLisp


@dataclass(frozen=True)
class AlgoLispExample:
    text: list[str]  # the problem statement's tokens
    program: list[str]  # the flattened ``short_tree``
    line: int


def flatten_program(tree: list, brackets: str = "[]") -> list[str]:
    """A nested-list program as tokens, as tensor2tensor's ``ProgramSearchAlgolisp``
    (data_generators/program_search.py, ``_flatten_target_programs``): every list, the
    outermost one included, becomes ``[`` + its elements flattened + ``]``, e.g.
    ``["invoke1", ["lambda1", "a"], "b"]`` -> ``[ invoke1 [ lambda1 a ] b ]``.
    ``brackets`` = "()" writes the Lisp form instead."""
    tokens = [brackets[0]]
    for node in tree:
        tokens += flatten_program(node, brackets) if isinstance(node, list) else [node]
    tokens.append(brackets[1])
    return tokens


def _is_tree(node: Any) -> bool:
    return isinstance(node, list) and all(
        isinstance(n, str) or _is_tree(n) for n in node)


def read_algolisp(path: str | os.PathLike, brackets: str = "[]") -> list[AlgoLispExample]:
    """AlgoLisp ``metaset3.*.jsonl``: one JSON record per line; ``text`` (the statement's
    tokens) and ``short_tree`` (the program, a nested list of strings) are read, the other
    fields (``tests``, ``args``, ``funcs``, ...) ignored.  Blank lines hold no record and are
    skipped; anything else that is not such a record is a DataFormatError naming file and
    line."""
    examples = []
    for number, _, record in json_records(path, "a JSON object (an AlgoLisp record)"):
        text, tree = record.get("text"), record.get("short_tree")
        if not (isinstance(text, list) and text and all(isinstance(w, str) for w in text)):
            raise DataFormatError(path, number, '"text": a non-empty list of word strings',
                                  repr(text))
        if not (_is_tree(tree) and tree):
            raise DataFormatError(path, number, '"short_tree": a non-empty nested list of '
                                  "strings (the program)", repr(tree))
        examples.append(AlgoLispExample(text, flatten_program(tree, brackets), number))
    if not examples:
        raise DataFormatError(path, None, "at least one AlgoLisp record")
    return examples


class AlgoLispDataModule(TranslationDataModule):
    """AlgoLisp program search (Polosukhin & Skidanov 2018; the ``metaset3`` files of
    tensor2tensor's ``ProgramSearchAlgolisp``): the problem statement's ``text`` tokens to
    the program ``short_tree``, flattened as tensor2tensor does (:func:`flatten_program`:
    ``[ invoke1 [ lambda1 [ if ... ] ] a ]``).  The files are ``metaset3.{train,dev,test}
    .jsonl`` (tensor2tensor downloads them gzipped from Dropbox; gunzip them first).

    Word vocabularies, one for the statements and one for the programs, of every token of
    the training split (cached under ``cache_dir()``); tokens unseen in training are
    ``<unk>``.  The metric is exact match of the program (``bleu`` None): ``references`` and
    ``raw_references`` are the program tokens joined by spaces, ``decode`` gives the same
    form, ``detokenize`` is the identity; ``sources`` are the statements joined by spaces.
    ``max_len`` None: no length filter (pairs with an empty side are still dropped from
    training).  Other arguments: :class:`TranslationDataModule`.
    """

    name = "algolisp"
    dataset = "algolisp"
    bleu = None
    directions = (("text", "program"),)
    shared_folder = "algolisp"

    def __init__(self, data_dir: str | None = None, train_file: str = "metaset3.train.jsonl",
                 val_file: str = "metaset3.dev.jsonl", test_file: str = "metaset3.test.jsonl",
                 brackets: str = "[]", max_len: int | None = None, **kwargs: Any):
        super().__init__(data_dir, "text", "program", max_len=max_len, **kwargs)
        if len(brackets) != 2 or brackets[0] == brackets[1]:
            raise ValueError(f"brackets must be two different characters, got {brackets!r}")
        self.files = {"train": train_file, "val": val_file, "test": test_file}
        self.brackets = brackets

    def split_files(self, split: str) -> list[tuple[Path, str]]:
        return [(self.path(self.files[split]), f"{split} file ({split}_file="
                 f"{self.files[split]!r}; the AlgoLisp release names "
                 f"metaset3.{'dev' if split == 'val' else split}.jsonl)")]

    def read_split(self, split: str, limit: int | None) -> SplitText:
        examples = read_algolisp(self.split_files(split)[0][0], self.brackets)[:limit]
        return SplitText([(e.text, e.program) for e in examples],
                         sources=[" ".join(e.text) for e in examples],
                         references=[" ".join(e.program) for e in examples],
                         raw_references=[" ".join(e.program) for e in examples])

    def build_tokenizers(self) -> tuple[TextTokenizer, TextTokenizer]:
        pairs = self.split_text("train").pairs
        return tuple(build_tokenizer("word", [p[side] for p in pairs], name=f"{self.name}-{kind}")
                     for side, kind in enumerate(("text", "program")))

    def detokenize(self, text: str) -> str:
        return text
