"""datamodules.common: length bucketing (one epoch covers every example once, shards are
disjoint across processes) and the bucketed loader, padding, the vocabulary and format
errors."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from datamodules.common import BucketBatchSampler, DataFormatError, Vocab, bucketed_loader, pad

_rng = random.Random(0)
LENGTHS = [_rng.randint(1, 60) for _ in range(503)]


def test_an_epoch_covers_every_example_once_in_length_buckets():
    sampler = BucketBatchSampler(LENGTHS, batch_size=16, pool=4, seed=1)
    batches = list(sampler)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(LENGTHS)))
    assert len(batches) == len(sampler) == 32  # ceil(503 / 16): pools of 64 cut in 16s
    def spread(batches):
        return sum(max(LENGTHS[i] for i in b) - min(LENGTHS[i] for i in b) for b in batches)

    random.Random(0).shuffle(flat)
    unsorted = [flat[k:k + 16] for k in range(0, len(flat), 16)]
    assert spread(batches) < spread(unsorted) / 2

def test_epochs_differ_and_repeat_by_seed():
    a = BucketBatchSampler(LENGTHS, 16, seed=3)
    b = BucketBatchSampler(LENGTHS, 16, seed=3)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    b.set_epoch(1)
    assert list(a) == list(b)
    evaluation = BucketBatchSampler(LENGTHS, 16, shuffle=False)
    assert list(evaluation) == list(evaluation)


def test_shards_are_disjoint_and_equal_across_processes():
    shards = [list(BucketBatchSampler(LENGTHS, 16, seed=2, num_replicas=2, rank=r))
              for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 16  # 32 batches, one half each
    ids = [{tuple(b) for b in s} for s in shards]
    assert not ids[0] & ids[1]
    assert sorted(i for s in shards for b in s for i in b) == list(range(len(LENGTHS)))


def test_evaluation_shards_count_every_example_once():
    """32 batches over 2 and 3 processes: in evaluation the shards
    together hold every example exactly once; in training they are padded to equal counts."""
    lengths = LENGTHS  # 32 batches of 16, the last one short
    for replicas in (2, 3):
        shards = [list(BucketBatchSampler(lengths, 16, shuffle=False, num_replicas=replicas,
                                          rank=r)) for r in range(replicas)]
        assert sorted(i for s in shards for b in s for i in b) == list(range(len(lengths)))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        train = [list(BucketBatchSampler(lengths, 16, seed=1, num_replicas=replicas, rank=r))
                 for r in range(replicas)]
        assert len({len(s) for s in train}) == 1  # equal steps for DDP
    # fewer batches than processes: smaller batches, every process one, each example once
    shards = [list(BucketBatchSampler(LENGTHS[:20], 16, shuffle=False, num_replicas=3, rank=r))
              for r in range(3)]
    assert [len(s) for s in shards] == [1, 1, 1]
    assert sorted(i for s in shards for b in s for i in b) == list(range(20))


def test_bucketed_loader_gives_the_batches_of_the_datamodules_own_loaders():
    items = list(range(len(LENGTHS)))  # item i is i, so a batch is its indices
    loader = bucketed_loader(items, LENGTHS, 16, list, shuffle=True, seed=3)
    # what the text, NLI and MLU DataModules each built for themselves before
    before = DataLoader(items, batch_sampler=BucketBatchSampler(LENGTHS, 16, seed=3),
                        collate_fn=list)
    batches = list(loader)
    assert batches == list(before)
    assert batches[0] == [493, 231, 198, 313, 362, 125, 1, 346, 498, 370, 229, 415, 156, 9,
                          270, 69]  # lengths 24 to 26: one bucket
    assert loader.num_workers == 0 and not loader.persistent_workers
    # evaluation order, and each of a trainer's processes taking its share
    trainer = SimpleNamespace(world_size=2, global_rank=1)
    shard = bucketed_loader(items, LENGTHS, 16, list, shuffle=False, trainer=trainer)
    assert list(shard) == list(BucketBatchSampler(LENGTHS, 16, shuffle=False,
                                                  num_replicas=2, rank=1))


def test_bucketed_loader_keeps_its_workers_between_epochs():
    items = list(range(len(LENGTHS)))
    loader = bucketed_loader(items, LENGTHS, 16, list, shuffle=True, seed=3, num_workers=2)
    assert loader.num_workers == 2 and loader.persistent_workers
    assert list(loader.batch_sampler) == list(BucketBatchSampler(LENGTHS, 16, seed=3))


def test_pad_and_mask():
    ids, mask = pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert torch.equal(pad([[]], pad_id=1)[0], torch.tensor([[1]]))


def test_vocab():
    v = Vocab.build([["b", "a", "b"], ["c", "b", "a"]], min_freq=2)
    assert v.itos == ["<pad>", "<unk>", "<s>", "</s>", "b", "a"]
    assert v.encode(["a", "zzz"], bos=True, eos=True) == [2, 5, 1, 3]
    assert v.decode([4, 5, 3, 4]) == ["b", "a"]
    strict = Vocab(["x"], unk=None)
    with pytest.raises(KeyError, match="'y' is not in the vocabulary"):
        strict["y"]


def test_format_error_names_file_and_line():
    err = DataFormatError("data/x.tsv", 12, "3 tab-separated fields", "a\tb")
    assert str(err) == "data/x.tsv:12: expected 3 tab-separated fields, got 'a\\tb'"
