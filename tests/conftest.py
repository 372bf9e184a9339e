"""Shared fixtures and helpers: the real published data at ../shared/data (skipped with a
reason when absent), float64 defaults and the head split for formula tests, the registry's
mechanisms per context, the perturbed hypotheses of the BLEU tests, running the
experiment scripts end to end, and the bad-data tests' private cache and the valid lines
they share.

Plain helpers are imported (``from tests.conftest import heads``); fixtures are found by
pytest."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import Tensor

from attention.registry import supporting  # noqa: F401 - tests import it from here
from datamodules.common import shared_data_dir

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)

ROOT = Path(__file__).resolve().parents[1]


def shared_path(relative: str) -> Path:
    """A file or folder of ../shared/data, or skip the test saying what is missing."""
    path = shared_data_dir() / relative
    if not path.exists():
        pytest.skip(f"real data not available: {path} "
                    "(tests read ../shared/data beside the project)")
    return path


@pytest.fixture
def shared():
    return shared_path


# -- attention formulas ------------------------------------------------------------------------
@pytest.fixture
def float64():
    """Formulas are compared in float64; the default is restored for other tests.  A file
    uses it for every test with ``pytestmark = pytest.mark.usefixtures("float64")``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def heads(x: Tensor, h: int) -> Tensor:
    """(B, L, D) -> (B, h, L, D // h): the head split of MultiHeadAttention."""
    b, n, d = x.shape
    return x.view(b, n, h, d // h).transpose(1, 2)


# -- BLEU -----------------------------------------------------------------------------------------
def perturbed(i: int, line: str) -> str:
    """A hypothesis made from reference ``i``: some lines emptied, shortened, reordered or
    re-cased, so every n-gram order and the brevity penalty are exercised."""
    words = line.split()
    if i % 10 == 3:
        return ""
    if i % 3 == 0:
        words = words[:-1]
    if i % 4 == 1 and len(words) > 2:
        words[0], words[1] = words[1], words[0]
    if i % 5 == 2:
        words = [w.upper() if j % 2 else w for j, w in enumerate(words)]
    return " ".join(words)


# -- the experiment scripts end to end ---------------------------------------------------------
@pytest.fixture
def env(tmp_path):
    """The environment of an experiment script: no W&B settings (no API key, so the runner
    must choose offline logging by itself), runs, caches and home under tmp_path, one thread
    per run."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    e.update(ATTNREPRO_RUNS=str(tmp_path / "runs"), ATTNREPRO_CACHE=str(tmp_path / "cache"),
             HOME=str(tmp_path), ATTNREPRO_THREADS="1")
    return e


def start(script: Path, args: list[str], env: dict) -> subprocess.Popen:
    """Start ``python script *args`` in the project root (stderr merged into stdout)."""
    return subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    """The output of a started script, which must succeed within ``timeout`` seconds."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, out[-6000:]
    hits = recompile_limit_lines(out)
    assert not hits, ("torch.compile hit its recompile limit (lines "
                      f"{', '.join(map(str, hits))}): {out[-6000:]}")
    return out


#: what dynamo logs when a compiled function has been compiled for too many shapes and
#: falls back to eager (``torch._dynamo hit config.recompile_limit (8)``)
RECOMPILE_LIMIT = ("recompile_limit", "cache_size_limit")


def recompile_limit_lines(text: str) -> list[int]:
    """The numbers of the lines of ``text`` that say torch.compile hit its recompile limit."""
    return [i for i, line in enumerate(text.splitlines(), 1)
            if any(word in line for word in RECOMPILE_LIMIT)]


def run(script: Path, args: list[str], env: dict, timeout: float = 300) -> str:
    """Run an experiment script to success and return its output."""
    return finish(start(script, args, env), timeout)


def last_values(path: Path) -> dict[str, float]:
    """The last logged value of every column of a Lightning metrics.csv."""
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out.update({k: float(v) for k, v in row.items() if v not in ("", None)})
    return out


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON Lines file (a run's predictions-test.jsonl)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def use_native_library(monkeypatch, library) -> None:
    """Turn ``library`` (an attention._native.NativeLibrary) and compiling on for one test and
    build it (skip without a C++ compiler; fail if it does not build)."""
    from attention import _compiled, _native

    if _native.compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(_compiled, "COMPILE", True)
    monkeypatch.setattr(library, "enabled", True)
    assert library.library() is not None, f"{library.what} failed to build"


def break_native_library(monkeypatch, tmp_path: Path, library) -> None:
    """Point ``library`` (an attention._native.NativeLibrary) at a source that does not
    compile, in an empty cache, with compiling on: its next use warns once and its callers
    take their fallback (as a machine without a working compiler would)."""
    from attention import _compiled, _native

    if _native.compiler() is None:
        pytest.skip("no C++ compiler")
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(library, "source", broken)
    monkeypatch.setattr(library, "_library", None)
    monkeypatch.setattr(library, "_failed", False)
    monkeypatch.setattr(library, "enabled", True)
    monkeypatch.setattr(_compiled, "COMPILE", True)


# -- bad data files (tests/*/test_bad_data_*.py) --------------------------------------------------
@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A cache of one's own under tmp_path.  A file uses it for every test with
    ``pytestmark = pytest.mark.usefixtures("private_cache")``."""
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))


# The valid lines of the published formats (the first lines of the real files, shortened)
# that more than one of the bad-data files writes.


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


def dnli(n: int = 1, label: str = "positive", **fields) -> dict:
    record = {"id": f"dev_{n}", "dtype": "have_x", "label": label,
              "sentence1": "i have a bike at home .", "sentence2": "i own a bike ."}
    record.update(fields)
    return {k: v for k, v in record.items() if v is not None}


DNLI = json.dumps([dnli(1), dnli(2, "negative")])
SST_TREES = ["(3 (2 It) (4 (2 's) (4 (3 (2 a) (4 lovely)) (2 film))))",
             "(1 (2 (1 No) (2 one)) (1 (2 goes) (2 .)))"]
LINZEN = ["VBP\tsince NNP models", "VBZ\tthe type and only species"]
LM1B = ["The U.S. Centers for Disease Control and Prevention initially advised school systems",
        "When I was a kid , I liked football ."]
IWSLT_EN = ["How can I speak in 10 minutes about the bonds of women ?",
            "This is not a finished story ."]
IWSLT_VI = ["Làm sao tôi có thể trình bày trong 10 phút ?", "Đây không phải là một câu chuyện "
            "đã kết thúc ."]
STANFORD_VOCAB = ["<unk>", "<s>", "</s>", "Rachel", ":"]
GLOVE = ["the 0.1 0.2 0.3", "film -0.5 0.25 1e-3"]


def lines(*rows: str) -> str:
    return "".join(row + "\n" for row in rows)


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
