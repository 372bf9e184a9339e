"""datamodules.fetch against a local HTTP server (127.0.0.1, a thread of the test process)
serving archives built here from the shared data in the official layouts; the registry's
URLs are monkeypatched to it.  Covers: download + unpack + the DataModule reads it, checksum
mismatch, resume with a Range request, two processes downloading once, the one-line offline
error and the status command.

Imports stay light at module level (no torch): the concurrency test's child processes
import this module."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from datamodules import fetch, registry
from datamodules.fetch import ChecksumError, DownloadError
from datamodules.registry import DATASETS
from experiments.harness.runner import main as run_script

ROOT = Path(__file__).resolve().parents[2]
SNLI_DEV = "snli/snli_1.0_dev.first1288.jsonl"
SNLI_FILES = [f"snli_1.0/snli_1.0_{s}.jsonl" for s in ("train", "dev", "test")]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shared(relative: str) -> Path:
    from tests.conftest import shared_path  # (imports torch: not at module level)

    return shared_path(relative)


# ----------------------------------------------------------------------------- the server

class Server:
    """``files``: URL path -> bytes; ``requests``: (path, Range header or None) of every GET;
    ``delay``: seconds slept per 64 KiB chunk (a slow download); ``ranges``: honour Range."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.delay, self.ranges = 0.0, True
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and server.ranges and rng.startswith("bytes=") and rng.endswith("-"):
                    start = int(rng[len("bytes="):-1])
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                for i in range(start, len(data), 1 << 16):
                    self.wfile.write(data[i:i + (1 << 16)])
                    time.sleep(server.delay)

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def gets(self, name: str) -> int:
        return sum(path == f"/{name}" for path, _ in self.requests)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))


def snli_zip() -> bytes:
    """snli_1.0.zip in the official layout (snli_1.0/snli_1.0_{train,dev,test}.jsonl), each
    file the shared SNLI dev prefix."""
    source = shared(SNLI_DEV).read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name in SNLI_FILES:
            z.writestr(name, source)
        z.writestr("__MACOSX/snli_1.0/._snli_1.0_dev.jsonl", b"junk")
    return buffer.getvalue()


def serve(monkeypatch, server: Server, key: str, files: dict[str, bytes],
          sha: dict[str, str | None] | None = None) -> None:
    """Serve ``files`` (download name -> bytes) and point the registry's downloads of
    ``key`` there; sha256 of the served bytes unless ``sha`` says otherwise (size: None)."""
    entry = DATASETS[key]
    downloads = []
    for d in entry.downloads:
        if d.name in files:
            server.files[f"/{d.name}"] = files[d.name]
            digest = (sha or {}).get(d.name, sha256(files[d.name]))
            d = replace(d, url=server.url(d.name), sha256=digest, size=None)
        downloads.append(d)
    monkeypatch.setitem(DATASETS, key, replace(entry, downloads=tuple(downloads)))


# ----------------------------------------------------------------------------- (a)

def test_download_unpack_and_the_datamodule_reads_it(tmp_path, server, monkeypatch, capsys):
    from datamodules.nli import SNLIDataModule

    serve(monkeypatch, server, "snli", {"snli_1.0.zip": snli_zip()})
    # the command: into <data root>/snli, the DataModule's default folder
    assert fetch.main(["snli", "--data_dir", str(tmp_path / "root"), "--quiet"]) == 0
    folder = tmp_path / "root" / "snli"
    assert all((folder / f).exists() for f in SNLI_FILES) and (folder / "snli_1.0.zip").exists()
    assert not (folder / "__MACOSX").exists() and not list(folder.glob("*.part"))
    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "root"))
    dm = SNLIDataModule(max_train_examples=10)  # default data_dir: <data root>/snli
    assert dm.data_dir == folder
    dm.setup()
    assert len(dm.datasets["train"]) == 10 and dm.dropped_no_gold["val"] == 16
    assert server.gets("snli_1.0.zip") == 1

    # prepare(): a DataModule's own folder, before anything reads it (the class's url
    # attribute was read from the registry at import: point it at the server too)
    monkeypatch.setattr(SNLIDataModule, "url", server.url("snli_1.0.zip"))
    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "fresh"))
    dm = SNLIDataModule(max_train_examples=10)  # default folder missing: prepare makes it
    assert dm.data_dir == tmp_path / "fresh" / "snli" and not dm.data_dir.exists()
    fetch.prepare(dm)
    fetch.prepare(dm)  # once per object
    assert dm.vocab_size > 2 and server.gets("snli_1.0.zip") == 2
    SNLIDataModule(max_train_examples=10).prepare_data()  # files there: no download
    assert server.gets("snli_1.0.zip") == 2
    assert "Traceback" not in capsys.readouterr().err


def test_fit_downloads_before_the_argument_links_read_the_vocabulary(tmp_path, server,
                                                                     monkeypatch):
    """The command, not only ``fetch.prepare``: ``coda_nli.py fit`` with an empty data root
    downloads SNLI once and trains (the bug: LightningCLI's links read the vocabulary, and
    so the files, before Lightning calls ``prepare_data``, so an empty folder failed with
    "... or let prepare_data fetch it" and was never filled)."""
    from datamodules.nli import SNLIDataModule
    from experiments import coda_nli

    serve(monkeypatch, server, "snli", {"snli_1.0.zip": snli_zip()})
    monkeypatch.setattr(SNLIDataModule, "url", server.url("snli_1.0.zip"))
    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    data = tmp_path / "snli.yaml"
    data.write_text("data:\n  class_path: datamodules.nli.SNLIDataModule\n  init_args:\n"
                    "    max_train_examples: 64\n    batch_size: 32\n")
    config = Path(__file__).resolve().parents[2] / "experiments/configs/coda_nli/smoke.yaml"
    run_script(coda_nli.EXPERIMENT, ["fit", "--config", str(config), "--config", str(data),
                              "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
                              "--trainer.callbacks=[]", "--run.wandb", "false",
                              "--run.name", "fetched"])
    assert server.gets("snli_1.0.zip") == 1
    assert (tmp_path / "empty" / "snli" / "snli_1.0" / "snli_1.0_train.jsonl").exists()
    metrics = next((tmp_path / "runs").rglob("fetched/metrics.csv")).read_text()
    assert "train/loss" in metrics  # it trained on the downloaded files


# ----------------------------------------------------------------------------- (b)

def test_checksum_mismatch_deletes_the_download(tmp_path, server, monkeypatch, capsys):
    serve(monkeypatch, server, "snli", {"snli_1.0.zip": b"not the release" * 1000},
          sha={"snli_1.0.zip": "0" * 64})
    dest = tmp_path / "snli" / "snli_1.0.zip"
    with pytest.raises(ChecksumError, match=r"snli: .*snli_1.0.zip gave 15000 bytes with "
                                            r"sha256 [0-9a-f]{64}, expected sha256 0{64}; "
                                            r"deleted the download"):
        fetch.ensure("snli", tmp_path / "snli", [tmp_path / "snli" / SNLI_FILES[0]],
                     progress=False)
    assert not dest.exists() and not dest.with_name("snli_1.0.zip.part").exists()
    # from the command line: one line, no traceback, exit status 1
    assert fetch.main(["snli", "--data_dir", str(tmp_path), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: snli: ") and "0" * 64 in err[0]
    with pytest.raises(ValueError):  # a mismatch is a ValueError, as it always was
        fetch.download_file(server.url("snli_1.0.zip"), tmp_path / "x.zip", "1" * 64, None,
                            progress=False)


# ----------------------------------------------------------------------------- (c)

def test_resume_of_a_partial_file(tmp_path, server):
    data = os.urandom(300_000)
    server.files["/big.bin"] = data
    dest = tmp_path / "big.bin"
    dest.with_name("big.bin.part").write_bytes(data[:150_000])
    fetch.download_file(server.url("big.bin"), dest, sha256(data), len(data), progress=False)
    assert server.requests == [("/big.bin", "bytes=150000-")]
    assert dest.read_bytes() == data and not dest.with_name("big.bin.part").exists()
    # a server that ignores Range (200, the whole file): started again from zero
    server.ranges = False
    other = tmp_path / "other.bin"
    other.with_name("other.bin.part").write_bytes(data[:1000])
    fetch.download_file(server.url("big.bin"), other, sha256(data), progress=False)
    assert other.read_bytes() == data
    # present and matching: no request at all
    fetch.download_file(server.url("big.bin"), dest, sha256(data), progress=False)
    assert len(server.requests) == 2


# ----------------------------------------------------------------------------- (d)

def _download_in_child(url: str, digest: str, folder: str, barrier, times) -> None:
    """A child process (spawned): point the registry at the server, wait for the other one,
    get SNLI into ``folder``; report when it started and ended."""
    entry = DATASETS["snli"]
    DATASETS["snli"] = replace(entry, downloads=(replace(entry.downloads[0], url=url,
                                                         sha256=digest, size=None),))
    barrier.wait()
    start = time.monotonic()
    root = Path(folder)
    fetch.ensure("snli", root, [root / f for f in SNLI_FILES], progress=False)
    assert all((root / f).exists() for f in SNLI_FILES)
    times.put((start, time.monotonic()))


def test_two_processes_download_once(tmp_path, server):
    data = snli_zip()
    server.files["/snli_1.0.zip"] = data
    server.delay = 1.5 / (len(data) / (1 << 16))  # about 1.5 s to serve the archive
    ctx = multiprocessing.get_context("spawn")
    barrier, times = ctx.Barrier(2), ctx.Queue()
    args = (server.url("snli_1.0.zip"), sha256(data), str(tmp_path / "snli"), barrier, times)
    children = [ctx.Process(target=_download_in_child, args=args) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0]
    (s1, e1), (s2, e2) = times.get(timeout=5), times.get(timeout=5)
    assert max(s1, s2) < min(e1, e2)  # they overlapped: the second waited for the first
    assert server.gets("snli_1.0.zip") == 1


# ----------------------------------------------------------------------------- (e)

def closed_port_url(name: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


def test_offline_is_one_line_naming_dataset_url_and_path(tmp_path, monkeypatch):
    url = closed_port_url("snli_1.0.zip")
    dest = tmp_path / "snli" / "snli_1.0.zip"
    files = [dest.parent / "snli_1.0" / f"snli_1.0_{split}.jsonl" for split in ("train", "dev")]
    expected = (f"snli: could not download {url} ([Errno 111] Connection refused); "
                f"put the file at {dest}; it holds the missing {files[0]}, {files[1]} and "
                "{} more")  # the release's 6 files (.jsonl, .txt) for the command; 3 for SNLI
    code = (f"import sys, dataclasses as d; from datamodules import fetch as f; "
            f"e = f.DATASETS['snli']; f.DATASETS['snli'] = d.replace(e, downloads=("
            f"d.replace(e.downloads[0], url={url!r}),)); "
            f"sys.exit(f.main(['snli', '--data_dir', {str(tmp_path)!r}, '--quiet']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"error: {expected.format(4)}"]  # one line
    assert not dest.parent.exists()  # a failed download leaves no folder (was: empty folder)
    assert list(tmp_path.iterdir()) == []

    from datamodules.nli import SNLIDataModule  # the same error from prepare_data

    monkeypatch.setattr(SNLIDataModule, "url", url)
    dm = SNLIDataModule(data_dir=str(tmp_path / "snli"))
    with pytest.raises(DownloadError) as err:
        dm.prepare_data()
    assert str(err.value) == expected.format(1) and isinstance(err.value, FileNotFoundError)


# ----------------------------------------------------------------------------- (f)

def test_status_present_missing_corrupt_unverified(tmp_path, capsys):
    folder = tmp_path / "iwslt15_en_vi"
    folder.mkdir()
    for name in ("tst2012.en", "vocab.en"):  # published sha256 / none known
        (folder / name).write_bytes(shared(f"iwslt15_en_vi/{name}").read_bytes())
    (folder / "tst2012.vi").write_text("not the release\n")  # a published sha256: corrupt
    assert fetch.main(["--status", "iwslt15", "--data_dir", str(tmp_path)]) == 0  # a report
    out = capsys.readouterr().out
    url = registry.STANFORD_NMT
    assert f"  present    tst2012.en  <- {url}tst2012.en\n" in out
    assert f"  unverified vocab.en  <- {url}vocab.en  [sha256: None]\n" in out
    assert f"  corrupt    tst2012.vi  <- {url}tst2012.vi\n" in out
    assert f"  missing    train.en  <- {url}train.en\n" in out
    assert f"folder {folder}: incomplete (5 of 8 missing, 1 corrupt)" in out
    (folder / "train.en.part").write_bytes(b"x" * 2_000_000)
    fetch.main(["--status", "iwslt15", "--data_dir", str(tmp_path)])
    assert "missing    train.en  <- " + url + "train.en  [partial download: 2.0 MB, resumes]" \
        in capsys.readouterr().out

    # an unpacked archive: its files present, the archive not needed; then complete
    snli = tmp_path / "snli"
    for name in DATASETS["snli"].files:
        (snli / name).parent.mkdir(parents=True, exist_ok=True)
        (snli / name).write_text("{}\n")
    assert fetch.main(["--status", "snli", "--data_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "missing    snli_1.0.zip  <- https://nlp.stanford.edu/projects/snli/snli_1.0.zip  " \
           "[not needed: unpacked]" in out
    assert f"folder {snli}: complete" in out and "  present    snli_1.0/snli_1.0_train.jsonl" in out


def test_status_of_every_dataset_is_a_summary_first(tmp_path, capsys):
    """--status (all): a line counting the datasets by state, one line each; --details (or
    a dataset named) every file."""
    folder = tmp_path / "iwslt15_en_vi"
    folder.mkdir()
    (folder / "tst2012.en").write_bytes(shared("iwslt15_en_vi/tst2012.en").read_bytes())
    (folder / "tst2012.vi").write_text("not the release\n")  # corrupt
    (tmp_path / "snli").mkdir()
    for name in DATASETS["snli"].files:
        (tmp_path / "snli" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "snli" / name).write_text("{}\n")
    assert fetch.main(["--status", "--data_dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    words = {key: rest.split(" (")[0] for key, rest in
             (line.strip().split(maxsplit=1) for line in lines[1:-1])}
    assert list(words) == list(DATASETS)  # one line per dataset
    assert words["snli"] == "complete" and words["iwslt15"] == "incomplete"
    assert words["multinli"] == "missing" and words["dialogue_nli"] == "by hand"
    assert "  iwslt15          incomplete (6 of 8 missing, 1 corrupt)" in lines
    counts = {w: list(words.values()).count(w) for w in fetch.SUMMARY_STATES}
    assert lines[0] == f"{len(DATASETS)} datasets under {tmp_path}: " + ", ".join(
        f"{n} {w}" for w, n in counts.items() if n)
    assert lines[-1].endswith("python -m datamodules.fetch --status --details [<dataset> ...]")
    assert fetch.main(["--status", "all", "--details", "--data_dir", str(tmp_path)]) == 0
    assert fetch.main(["--check", "iwslt15", "--data_dir", str(tmp_path)]) == 1
    details = capsys.readouterr().out
    assert f"folder {folder}: incomplete (6 of 8 missing, 1 corrupt)" in details
    assert "  corrupt    tst2012.vi  <- " in details


# ----------------------------------------------------------------------------- more layouts

def test_text_datamodule_unpacks_the_archive_folder_into_data_dir(tmp_path, server, monkeypatch):
    """SST: trainDevTestTrees_PTB.zip holds trees/*.txt; their contents land in data_dir."""
    from datamodules.sst import SSTDataModule

    lines = shared("sst_ptb/dev.txt").read_text().splitlines(keepends=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for split, part in (("train", lines[:60]), ("dev", lines[60:80]), ("test", lines[80:100])):
            z.writestr(f"trees/{split}.txt", "".join(part))
    serve(monkeypatch, server, "sst", {"trainDevTestTrees_PTB.zip": buffer.getvalue()})
    dm = SSTDataModule(data_dir=str(tmp_path / "sst_ptb"), granularity="fine")
    fetch.prepare(dm)
    assert sorted(p.name for p in (tmp_path / "sst_ptb").glob("*.txt")) == \
        ["dev.txt", "test.txt", "train.txt"]
    dm.setup()
    assert dm.stats["examples"] == {"train": 60, "val": 20, "test": 20}


def test_translation_files_and_an_optional_test_split(tmp_path, server, monkeypatch, capsys):
    """IWSLT'15: plain files (train from the shared prefix, so no published checksum; tst2012
    and the vocabularies as released, tst2012 checked against its published sha256); tst2013
    is not served: only a warning, since fit does not read the test split."""
    from datamodules.iwslt import IWSLT15DataModule

    files = {f"train.{lang}": shared(f"iwslt15_en_vi/train.first1000.{lang}").read_bytes()
             for lang in ("en", "vi")}
    files |= {name: shared(f"iwslt15_en_vi/{name}").read_bytes()
              for name in ("tst2012.en", "tst2012.vi", "vocab.en", "vocab.vi")}
    published = {d.name: d.sha256 for d in DATASETS["iwslt15"].downloads}
    serve(monkeypatch, server, "iwslt15", files | {"tst2013.en": b"", "tst2013.vi": b""},
          sha={n: published[n] for n in ("tst2012.en", "tst2012.vi")})
    server.files.pop("/tst2013.en"), server.files.pop("/tst2013.vi")  # 404
    dm = IWSLT15DataModule(str(tmp_path / "iwslt"), train_size=50)
    dm.prepare_data()
    assert "warning: iwslt15: could not download" in capsys.readouterr().err
    dm.setup("fit")
    assert len(dm.datasets["val"]) == 1553 and dm.src_vocab_size == 17192
    assert sorted(p.name for p in (tmp_path / "iwslt").iterdir() if not p.name.startswith(".")) \
        == ["train.en", "train.vi", "tst2012.en", "tst2012.vi", "vocab.en", "vocab.vi"]


def test_registry_matches_the_datamodules():
    from datamodules.nli import MultiNLIDataModule, SciTailDataModule, SNLIDataModule
    from datamodules.ranking import WIKIQA_URL
    from datamodules.sst import SSTDataModule
    from datamodules.wmt import WMT14DataModule

    assert SNLIDataModule.url == registry.url_of("snli")
    assert MultiNLIDataModule.url == registry.url_of("multinli")
    assert SciTailDataModule.url == registry.url_of("scitail")
    assert WIKIQA_URL == registry.url_of("wikiqa")
    assert registry.dataset_of(SSTDataModule(data_dir="x", format="glue")).key == "sst2"
    assert registry.dataset_of(WMT14DataModule("x", source="fr", target="en")).key == "wmt14_en_fr"
    assert registry.dataset_of(WMT14DataModule("x")).key == "wmt14_en_de"
    # each reader the registry names declares its entry (a class attribute, or a property
    # where the settings choose between entries: SST, WikiQA, WMT'14)
    import importlib

    classes = {name: cls for module in ("nli", "ranking", "text", "imdb", "sst", "sva", "lm1b",
                                        "iwslt", "wmt", "algolisp", "mlu", "open_qa")
               for name, cls in vars(importlib.import_module(f"datamodules.{module}")).items()
               if name.endswith("DataModule")}
    for entry in DATASETS.values():
        for name in entry.datamodules:
            declared = classes[name].__dict__.get("dataset")
            assert declared == entry.key or isinstance(declared, property), (name, entry.key)
    for entry in DATASETS.values():  # every sha256 is 64 hex digits or None (unknown)
        for d in entry.downloads:
            assert d.sha256 is None or (len(d.sha256) == 64 and int(d.sha256, 16) >= 0)


def test_the_progress_bar_shows_the_file_and_its_size(tmp_path, server, capsys):
    """A download with ``progress`` (the default of ``fetch``'s command without --quiet)
    draws tqdm's bar on stderr: the file's name and its total (a download this fast ends
    before the bar's first redraw, so only its start shows); ``progress=False``: nothing."""
    server.files["/big.bin"] = b"x" * 300_000
    fetch.download_file(server.url("big.bin"), tmp_path / "big.bin", progress=True)
    err = capsys.readouterr().err
    assert "\rbig.bin:   0%|" in err and "/293k [" in err  # 300,000 B in 1024-based units
    fetch.download_file(server.url("big.bin"), tmp_path / "quiet.bin", progress=False)
    assert capsys.readouterr().err == ""


def test_prepare_data_runs_once_per_datamodule(tmp_path, monkeypatch):
    """fetch.prepare before the model is built, Lightning's trainer again before fitting:
    the DataModule asks for its files once."""
    from datamodules import translation
    from datamodules.iwslt import IWSLT15DataModule

    asked = []
    monkeypatch.setattr(translation, "ensure", lambda key, *a, **k: asked.append(key) or [])
    dm = IWSLT15DataModule(str(tmp_path))
    fetch.prepare(dm)
    dm.prepare_data()
    assert asked == ["iwslt15"]
    IWSLT15DataModule(str(tmp_path)).prepare_data()  # another object asks again
    assert asked == ["iwslt15", "iwslt15"]
