"""Several processes building the same cold caches at the same moment (fileio): grid cells
run at once and DDP ranks each build the vocabularies, BPE models, tokenized text and
word-vector tensors they read.  N = 4 processes start each DataModule family's build
together (a file barrier per family); all must succeed, read identical data and leave
identical cache files, no temporary file behind.  Then the smoke grids of two experiments
with ``--jobs 2`` on a cold cache, three times.

Run as ``python -m tests.fileio.test_cache_race WORKDIR INDEX N`` this file is one of the
processes (what each family builds: :data:`FAMILIES`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fileio import build_once, write_atomic, write_once

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
N = 4
SNLI_DEV = "snli/snli_1.0_dev.first1288.jsonl"
GLOVE_WORDS = ["a", "man", "the", "is", "dog", "cat", "."]


def digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def build_nli(work: Path) -> str:
    from datamodules.nli import SNLIDataModule

    path = Path(os.environ["RACE_DATA"]) / SNLI_DEV
    dm = SNLIDataModule(data_dir=str(path.parent), train_file=path.name, val_file=path.name,
                        test_file=path.name)
    dm.setup("fit")
    return digest(dm.vocab.itos)


def build_glove(work: Path) -> str:
    from datamodules.common import Vocab
    from datamodules.glove import vocab_vectors

    vocab = Vocab(GLOVE_WORDS + ["unseen"])
    vectors = vocab_vectors(work / "glove.tiny.8d.txt", vocab, dim=8, seed=1)
    return digest(vectors.weight.tolist(), vectors.found, vectors.oov)


def build_text(work: Path) -> str:
    from datamodules.sst import SSTDataModule

    dm = SSTDataModule(data_dir=os.path.join(os.environ["RACE_DATA"], "sst_ptb"),
                       tokenization="bpe", bpe_vocab_size=500, max_train_examples=300)
    dm.setup("fit")
    return digest(dm.tokenizer.encode_batch([["a", "remarkable", "film"]]), dm.vocab_size)


def build_translation(work: Path) -> str:
    from datamodules.wmt import WMT16EnRoDataModule

    dm = WMT16EnRoDataModule(str(work / "wmt16_en_ro"), bpe_merges=20, batch_size=8)
    dm.setup("fit")
    source, target = dm.tokenizers
    return digest(source.encode_batch([["The", "small", "cat", "."]]), source.vocab_size,
                  target.vocab_size, len(dm.datasets["train"]))


def build_mlu(work: Path) -> str:
    from datamodules.mlu import MLUDataModule

    dm = MLUDataModule(train_size=2000, val_size=100, test_size=100)
    dm.setup("fit")
    return digest([dm.datasets[s].problems[:50] for s in ("train", "val", "test")])


#: family -> (what a process builds, the data it needs under the data root, cache files made)
FAMILIES = {"nli": (build_nli, SNLI_DEV, ["vocab-snli-*.json"]),
            "glove": (build_glove, None, ["vectors-glove.tiny.8d-*.pt"]),
            "text": (build_text, "sst_ptb/train.txt", ["sst-bpe-*.json"]),
            "translation": (build_translation, None,
                            ["wmt16-train-*.tok.en", "wmt16-train-*.tok.ro",
                             "wmt16-enro-bpe-*.json"]),
            "mlu": (build_mlu, None, [])}  # generated in memory: no file


def wait_for_all(work: Path, family: str, index: int, n: int) -> None:
    """A barrier: every process starts the family's build at the same moment."""
    (work / f"ready-{family}-{index}").touch()
    deadline = time.monotonic() + 120
    while len(list(work.glob(f"ready-{family}-*"))) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{family}: the other processes never got ready")
        time.sleep(0.002)


def worker(work: Path, index: int, n: int) -> None:
    for family in json.loads(os.environ["RACE_FAMILIES"]):
        wait_for_all(work, family, index, n)
        print(json.dumps({"family": family, "digest": FAMILIES[family][0](work)}), flush=True)


def cache_files(cache: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(cache.iterdir())}


@pytest.mark.slow
def test_four_processes_build_every_cold_cache_at_once(tmp_path):
    from datamodules.common import shared_data_dir

    data = shared_data_dir()
    families = [f for f, (_, needs, _) in FAMILIES.items() if needs is None
                or (data / needs).exists()]
    skipped = sorted(set(FAMILIES) - set(families))
    (tmp_path / "glove.tiny.8d.txt").write_text("".join(
        f"{w} " + " ".join(f"{(i + j) / 10:.1f}" for j in range(8)) + "\n"
        for i, w in enumerate(GLOVE_WORDS)))
    # a copy of the fixture: its mtime is part of the cache key, and make_fixtures.py may
    # rewrite the committed one meanwhile
    shutil.copytree(FIXTURES / "wmt16_en_ro", tmp_path / "wmt16_en_ro")
    cache = tmp_path / "cache"
    env = {**os.environ, "ATTNREPRO_CACHE": str(cache), "RACE_DATA": str(data),
           "RACE_FAMILIES": json.dumps(families), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.fileio.test_cache_race", str(tmp_path),
                               str(i), str(N)], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(N)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for i, (p, (_, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} of {N} failed:\n{err[-4000:]}"
    results = [[json.loads(line) for line in out.splitlines() if line.startswith("{")]
               for out, _ in outputs]
    for i, got in enumerate(results):
        assert [r["family"] for r in got] == families, f"process {i}: {got}"
    for k, family in enumerate(families):
        digests = {r[k]["digest"] for r in results}
        assert len(digests) == 1, f"{family}: the {N} processes read different data {digests}"
    files = cache_files(cache)
    leftovers = [name for name in files if name.endswith((".tmp", ".part"))]
    assert not leftovers, f"temporary files left in {cache}: {leftovers}"
    for family in families:
        for pattern in FAMILIES[family][2]:
            made = list(cache.glob(pattern))
            assert len(made) == 1, f"{family}: expected one {pattern} in {cache}, got {made}"
    # every file is the one all processes read: building again in this process from the
    # cache gives the same digests (and rewrites nothing)
    os.environ["ATTNREPRO_CACHE"] = str(cache)
    os.environ["RACE_DATA"] = str(data)
    try:
        for k, family in enumerate(families):
            assert FAMILIES[family][0](tmp_path) == results[0][k]["digest"], family
    finally:
        del os.environ["ATTNREPRO_CACHE"], os.environ["RACE_DATA"]
    assert cache_files(cache) == files
    if skipped:
        pytest.skip(f"built {families}; real data not available for {skipped} under {data}")


# ------------------------------------------------------------------------------- fileio


def test_write_atomic_leaves_the_old_file_on_failure(tmp_path):
    path = write_atomic(tmp_path / "a" / "out.txt", "first\n")
    assert path.read_text() == "first\n"
    assert write_atomic(path, b"\x00\x01").read_bytes() == b"\x00\x01"

    def half(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        write_atomic(path, half)
    assert path.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.txt"]
    mode = path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask, oct(mode)  # as open() would make it, not mkstemp's 0600


def test_writers_of_one_file_at_once_leave_one_whole_file(tmp_path):
    path = tmp_path / "out.txt"
    texts = [f"{i}" * 100_000 for i in range(8)]
    threads = [threading.Thread(target=write_atomic, args=(path, t)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert path.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_build_once_builds_once_and_loads_the_file(tmp_path):
    path = tmp_path / "entry.json"
    calls = []

    def build():
        calls.append(1)
        return {"n": len(calls)}

    def save(value, tmp):
        tmp.write_text(json.dumps(value))

    def load(p):
        return json.loads(p.read_text())

    assert build_once(path, build, save, load) == ({"n": 1}, True)
    assert build_once(path, build, save, load) == ({"n": 1}, False)
    assert calls == [1]
    assert write_once(path, "other") is False and load(path) == {"n": 1}


# ---------------------------------------------------------------------------- smoke grids

#: (script, grid arguments, data read): two cells each, started together on a cold cache
#: (decomp_snli's first two cells are the pair that raced in CI: vanilla and intra build the
#: same SNLI vocabulary; coda_text2code's two build the AlgoLisp vocabularies)
GRIDS = [("decomp_snli", ["table1", "--cells", "vanilla", "intra"], SNLI_DEV),
         ("coda_text2code", ["table7"], "algolisp/t2t_program_search_test_example.jsonl")]


@pytest.mark.slow
def test_smoke_grids_with_two_jobs_on_a_cold_cache_three_times(tmp_path):
    from datamodules.common import shared_data_dir

    for _, _, needs in GRIDS:
        if not (shared_data_dir() / needs).exists():
            pytest.skip(f"real data not available: {shared_data_dir() / needs}")
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    for attempt in range(3):
        root = tmp_path / str(attempt)
        env = {**base, "ATTNREPRO_RUNS": str(root / "runs"),
               "ATTNREPRO_CACHE": str(root / "cache"), "HOME": str(root),
               "ATTNREPRO_THREADS": "1", "ATTNREPRO_COMPILE": "0", "WANDB_MODE": "disabled"}
        for name, grid, _ in GRIDS:
            proc = subprocess.run([sys.executable, str(ROOT / "experiments" / f"{name}.py"),
                                   "grid", *grid, "--smoke", "--jobs", "2"], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=600)
            logs = "".join(p.read_text() for p in (root / "runs").glob(f"{name}/*/*/output.log"))
            assert proc.returncode == 0, (f"attempt {attempt + 1}: {name} grid {grid[0]} failed:\n"
                                          f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}{logs}")
            done = re.findall(r"done (\S+) seed 0", proc.stdout)
            assert len(done) == 2, f"attempt {attempt + 1}: {name}: cells done {done}\n{logs}"


if __name__ == "__main__":
    worker(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
