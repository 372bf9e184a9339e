"""MLU: the generator follows the documented distribution, is deterministic, keeps the
splits disjoint, and its answers are right; the reader parses the published format."""

from __future__ import annotations

import re

import pytest

from datamodules.common import DataFormatError
from datamodules.mlu import MLUDataModule, Problem, generate, read_problems, split_of

SIZES = {"train": 3000, "val": 300, "test": 300}


def independent_value(problem: str) -> int:
    """Evaluate by substituting the assignments into the expression (not the module's parser)."""
    *assignments, expression = problem.split(",")
    env = dict(a.split("=") for a in assignments)
    return eval("".join(f"({env[c]})" if c in env else c for c in expression))  # noqa: S307


def test_generator_is_deterministic_by_seed():
    a, b, c = generate(SIZES, seed=3), generate(SIZES, seed=3), generate(SIZES, seed=4)
    assert a == b
    assert a["train"][:50] != c["train"][:50]


def test_splits_are_disjoint_and_unique():
    g = generate(SIZES, seed=0)
    sets = {s: {p.problem for p in g[s]} for s in g}
    for split, problems in g.items():
        assert len(sets[split]) == len(problems) == SIZES[split]
        assert all(split_of(p.problem) == split for p in problems)
    assert not sets["train"] & sets["val"]
    assert not sets["train"] & sets["test"]
    assert not sets["val"] & sets["test"]
    # a bigger draw extends a smaller one, so sizes never move problems between splits
    assert generate({"test": 500}, seed=0)["test"][:300] == g["test"]


def test_answers_and_distribution():
    problems = generate({"train": 5000}, seed=1)["train"]
    form = re.compile(r"^([xy])=(-?\d+),([xy])=(-?\d+),([xy])([-+*])([xy])$")
    firsts, ops, repeats = set(), set(), 0
    for p in problems:
        m = form.match(p.problem)
        assert m, p
        assert m.group(1) != m.group(3)
        assert all(-1000 <= int(v) < 1000 for v in (m.group(2), m.group(4)))
        assert int(p.answer) == independent_value(p.problem)
        firsts.add(m.group(1))
        ops.add(m.group(6))
        repeats += m.group(5) == m.group(7)
    assert firsts == {"x", "y"} and ops == {"+", "-", "*"}
    assert 0.4 < repeats / len(problems) < 0.6  # operands drawn independently from {x, y}


def test_reader_on_the_published_example_lines(shared):
    problems = read_problems(shared("mlu/examples.txt"))
    assert problems == [Problem("y=691,x=-999,y*x", "-690309"),
                        Problem("y=210,x=-995,y+x", "-785"),
                        Problem("x=-995,y=210,x*x", "990025")]


@pytest.mark.parametrize("line, expected", [
    ("x=1,y=2,x+y3", "<int>"),
    ("x=1,x=2,x+x:3", "<int>"),
    ("x=1,y=2,x/y:0", "<int>"),
    ("x=1,y=2,x+y:4", "answer 3"),
    ("x=5000,y=2,x+y:5002", "values in [-1000, 1000), got '5000'"),
])
def test_reader_errors_name_file_and_line(tmp_path, line, expected):
    path = tmp_path / "bad.txt"
    path.write_text("x=1,y=2,x+y:3\n" + line + "\n")
    with pytest.raises(DataFormatError, match=rf"bad.txt:2: expected .*{re.escape(expected)}"):
        read_problems(path)


def test_reader_errors_for_bytes_missing_files_and_folders(tmp_path):
    """Not UTF-8, absent, a folder: one DataFormatError / FileNotFoundError naming the path."""
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"x=1,y=2,x+y:3\nx=1,y=2,x+y:3 \xe9\n")
    with pytest.raises(DataFormatError, match=r"latin1.txt:2: expected UTF-8 text"):
        read_problems(path)
    with pytest.raises(FileNotFoundError, match=r"MLU problem file not found at .*absent.txt"):
        read_problems(tmp_path / "absent.txt")
    with pytest.raises(DataFormatError, match=r"expected a problem file, not a directory"):
        read_problems(tmp_path)


@pytest.mark.parametrize("kwargs, message", [
    ({"train_size": 0}, "train_size must be at least 1 (or give train_file), got 0"),
    ({"test_size": -5}, "test_size must be at least 1 (or give test_file), got -5"),
    ({"batch_size": 0}, "batch_size must be at least 1, got 0"),
])
def test_datamodule_rejects_empty_splits(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MLUDataModule(**kwargs)


def test_datamodule_batches(tmp_path):
    dm = MLUDataModule(train_size=64, val_size=16, test_size=16, batch_size=8)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    v = dm.vocab
    assert batch["src"].shape[0] == 8
    assert (batch["tgt_in"][:, 0] == dm.bos_id).all()
    for i in range(8):
        n = int(batch["tgt_mask"][i].sum())
        assert batch["tgt_out"][i, n - 1] == dm.eos_id
        assert (batch["tgt_in"][i, 1:n] == batch["tgt_out"][i, : n - 1]).all()
        problem = "".join(v.decode(batch["src"][i]))
        answer = "".join(v.decode(batch["tgt_out"][i]))
        assert int(answer) == independent_value(problem)
        assert (batch["src"][i][~batch["src_mask"][i]] == dm.pad_id).all()


def test_datamodule_reads_files(tmp_path, shared):
    path = shared("mlu/examples.txt")
    dm = MLUDataModule(train_file=str(path), val_file=str(path), test_file=str(path),
                       batch_size=2)
    dm.setup()
    assert [p.answer for p in dm.datasets["test"].problems] == ["-690309", "-785", "990025"]
