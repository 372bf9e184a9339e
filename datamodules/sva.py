"""Subject-verb agreement, number prediction (Linzen, Dupoux and Goldberg 2016):
Differentiable Window Table 5 (SVA).

The ``rnn_agr_simple`` release (rnn_agr_simple.tar.gz): files ``numpred.train``,
``numpred.val`` and ``numpred.test`` (a 9/1/90 split; its README calls the second
``numpred.valid`` but the file is ``numpred.val``) and ``numpred.test.0`` .. ``.5`` (test
dependencies with 0-5 agreement attractors).  One example per line::

    VBZ<TAB>the type and only species

the Penn tag of the verb, a tab, then the sentence's tokens up to (not including) the verb,
space-separated (rare words are replaced by their POS tag, e.g. ``NNP``).  The task is to
predict the verb's number from the prefix: VBZ (3rd person singular present) -> 0
``singular``, VBP (non-3rd person present, i.e. plural subjects here) -> 1 ``plural``.
Any other tag is a DataFormatError.

``numpred.train`` is not in the shared copy: ``train_file`` is configurable (e.g.
``numpred.val`` for tests and small runs).
"""

from __future__ import annotations

from pathlib import Path

from datamodules.common import DataFormatError, read_lines, record_data_seed
from datamodules.registry import url_of
from datamodules.text import Example, TextClassificationDataModule, Tokenization, split_tokens

LABELS = ("singular", "plural")
VERB_TAGS = {"VBZ": 0, "VBP": 1}


def read_linzen(path: str | Path) -> list[Example]:
    """(prefix tokens, 0 singular / 1 plural) of every line of a numpred.* file (an empty
    file is an error: a split of no examples would evaluate to nothing)."""
    examples = []
    for number, text in read_lines(path):
        fields = text.split("\t")
        if len(fields) != 2:
            raise DataFormatError(path, number, "'VBZ|VBP<TAB>prefix' (2 fields)", text)
        tag, prefix = fields
        if tag not in VERB_TAGS:
            raise DataFormatError(path, number, "verb tag VBZ or VBP", tag)
        words = split_tokens(prefix)
        if not words:
            raise DataFormatError(path, number, "a non-empty prefix", text)
        examples.append((words, VERB_TAGS[tag]))
    if not examples:
        raise DataFormatError(path, None, "at least one line 'VBZ|VBP<TAB>prefix'")
    return examples


class SVADataModule(TextClassificationDataModule):
    """Linzen et al. number prediction from the prefix (see the module docstring)."""

    name = "sva"
    dataset = "sva"
    shared_subdir = "linzen_agreement"
    archive_url = url_of("sva")  # rnn_agr_simple.tar.gz (datamodules.fetch registry)
    archive_subdir = "rnn_agr_simple"
    labels = LABELS

    def __init__(self, data_dir: str | None = None, train_file: str = "numpred.train",
                 val_file: str | None = "numpred.val", test_file: str | None = "numpred.test",
                 tokenization: Tokenization = "word", bpe_vocab_size: int = 8192,
                 min_freq: int = 1, max_vocab_size: int | None = None, lowercase: bool = False,
                 batch_size: int = 32, max_len: int | None = 512,
                 max_train_examples: int | None = None, num_workers: int = 0,
                 seed: int | None = None):
        super().__init__(data_dir, tokenization, bpe_vocab_size, min_freq, max_vocab_size,
                         lowercase, batch_size, max_len, max_train_examples, num_workers, seed)
        self.save_hyperparameters()
        record_data_seed(self, self.seed)
        self.files = {"train": train_file, "val": val_file, "test": test_file}

    def split_files(self, split: str) -> list[Path]:
        name = self.files[split]
        return [] if name is None else [self.data_dir / name]

    def read_examples(self, split: str, limit: int | None = None) -> list[Example]:
        (path,) = self.split_files(split)
        return read_linzen(path)
