"""GloVe reader and vocabulary matrix on small files in the GloVe text format."""

from __future__ import annotations

import json

import pytest
import torch

import datamodules.glove as glove
from datamodules.common import PAD, UNK, DataFormatError, Vocab
from datamodules.glove import read_glove, vocab_vectors

DIM = 4
LINES = [
    "the 0.1 -0.2 0.3 0.4",
    ", 1 2 3 4",
    "dog -1.5 2.5e-1 0 7",
    "at&t ' s 0.5 0.5 0.5 0.5",  # a word with spaces, as in the 840B file
    "dog 9 9 9 9",  # a repeated word: the first line wins
    "cat 0.25 0.5 0.75 1",
]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def vectors_file(tmp_path):
    path = tmp_path / "glove.small.4d.txt"
    path.write_text("\n".join(LINES) + "\n")
    return path


def test_read_glove_words_and_vectors(vectors_file):
    read = list(read_glove(vectors_file, DIM))
    assert [w for w, _ in read] == ["the", ",", "dog", "at&t ' s", "dog", "cat"]
    assert torch.equal(read[2][1], torch.tensor([-1.5, 0.25, 0.0, 7.0]))
    assert read[3][1].tolist() == [0.5] * 4 and read[0][1].dtype == torch.float32
    only = list(read_glove(vectors_file, DIM, words={"cat", "the"}))
    assert [w for w, _ in only] == ["the", "cat"]


def test_word2vec_header_is_skipped(tmp_path):
    path = tmp_path / "with_header.txt"
    path.write_text("6 4\n" + "\n".join(LINES) + "\n")
    assert len(list(read_glove(path, DIM))) == 6
    with pytest.raises(DataFormatError, match=r"with_header.txt:1: expected vectors of dim"):
        list(read_glove(path, 300))


@pytest.mark.parametrize("bad, message", [
    ("cow 1 2 3", "3 numbers"),  # one number short
    ("cow 1 2 x 4", "a word followed by 4"),  # not a number
    (" 1 2 3 4", "an empty word"),
    ("", "0 numbers"),
])
def test_malformed_vector_lines_name_file_and_line(tmp_path, bad, message):
    path = tmp_path / "bad.txt"
    path.write_text("\n".join([*LINES[:3], bad, *LINES[3:]]) + "\n")
    with pytest.raises(DataFormatError, match=message) as err:
        list(read_glove(path, DIM))
    assert str(err.value).startswith(f"{path}:4: expected ")
    assert err.value.line == 4


def test_vocab_vectors_found_oov_pad(vectors_file):
    vocab = Vocab(["the", "dog", "cat", "zebra", "at&t ' s", "The"], specials=(PAD, UNK))
    result = vocab_vectors(vectors_file, vocab, dim=DIM, oov_std=0.1, seed=3)
    W = result.weight
    assert W.shape == (len(vocab), DIM) and W.dtype == torch.float32
    assert (result.found, result.oov) == (4, 2)  # zebra and The (case-sensitive) are OOV
    assert torch.equal(W[vocab["the"]], torch.tensor([0.1, -0.2, 0.3, 0.4]))
    assert torch.equal(W[vocab["dog"]], torch.tensor([-1.5, 0.25, 0.0, 7.0]))  # first line
    assert torch.equal(W[vocab["at&t ' s"]], torch.full((DIM,), 0.5))
    assert torch.equal(W[vocab.pad_id], torch.zeros(DIM))
    random_rows = W[[vocab["zebra"], vocab["The"], vocab[UNK]]]
    assert (random_rows != 0).all() and random_rows.abs().max() < 1.0
    assert not torch.equal(random_rows[0], random_rows[1])
    # the random rows depend on the seed only, not on the file
    again = vocab_vectors(vectors_file, vocab, dim=DIM, oov_std=0.1, seed=3, cache=False)
    assert torch.equal(again.weight, W)
    other = vocab_vectors(vectors_file, vocab, dim=DIM, oov_std=0.1, seed=4, cache=False)
    assert not torch.equal(other.weight[vocab["zebra"]], W[vocab["zebra"]])
    assert torch.equal(other.weight[vocab["cat"]], W[vocab["cat"]])


def test_cache_reused_and_invalidated(vectors_file, monkeypatch):
    vocab = Vocab(["the", "cat", "zebra"], specials=(PAD, UNK))
    first = vocab_vectors(vectors_file, vocab, dim=DIM)

    def no_read(*args, **kwargs):
        raise AssertionError("the vectors file should not be read again")

    with monkeypatch.context() as m:
        m.setattr(glove, "read_glove", no_read)
        cached = vocab_vectors(vectors_file, vocab, dim=DIM)
        assert torch.equal(cached.weight, first.weight)
        assert (cached.found, cached.oov) == (first.found, first.oov) == (2, 1)
        with pytest.raises(AssertionError, match="read again"):  # another vocabulary
            vocab_vectors(vectors_file, Vocab(["the"], specials=(PAD, UNK)), dim=DIM)
    vectors_file.write_text("\n".join(LINES).replace("cat 0.25", "cat 2.25") + "\n")
    changed = vocab_vectors(vectors_file, vocab, dim=DIM)
    assert changed.weight[vocab["cat"], 0] == 2.25


def test_missing_file_says_how_to_get_glove(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        vocab_vectors(tmp_path / "glove.840B.300d.txt", Vocab(["a"]), dim=300)
    message = str(err.value)
    assert "glove.840B.300d.txt" in message and "--data.vectors" in message
    assert "https://nlp.stanford.edu/data/glove.840B.300d.zip" in message


def test_datamodule_embeddings(tmp_path, vectors_file):
    from datamodules.nli import DialogueNLIDataModule

    record = {"label": "positive", "sentence1": "the cat", "sentence2": "the dog ,",
              "id": "1", "dtype": "misc", "triple1": ["a", "b", "c"], "triple2": ["a", "b", "c"]}
    for split in ("train", "dev", "test"):
        (tmp_path / f"dialogue_nli_{split}.jsonl").write_text(json.dumps([record]))
    dm = DialogueNLIDataModule(data_dir=str(tmp_path), vectors=str(vectors_file), vectors_dim=DIM)
    E = dm.embeddings
    assert E.shape == (dm.vocab_size, DIM) == (2 + 4, DIM)
    assert torch.equal(E[dm.vocab["cat"]], torch.tensor([0.25, 0.5, 0.75, 1.0]))
    assert torch.equal(E[dm.pad_id], torch.zeros(DIM))
