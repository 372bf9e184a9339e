"""The dataset registry: per dataset, the official URL(s), the file each download gives,
the folder it goes to under the data root and, where one is published, the sha256 of each
download (None: unknown, so not verified; the field is there for maintainers to fill in),
and the files no download gives (``manual``, with how to get them).

A DataModule names its entry in its ``dataset`` attribute (:func:`dataset_of`); downloading,
unpacking, the status report and the command are datamodules/fetch.py's.  A new dataset is
one more :class:`Dataset` in :data:`DATASETS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

HF_SHA = "sha256 as published by HF datasets (dataset_infos.json)"


@dataclass(frozen=True)
class Download:
    """One file to download.

    ``name``: the local file name in the dataset's folder (default: the URL's last part).
    ``archive``: unpack it after download (zip, tar, tar.gz or gz) into the dataset's folder:
    keeping its layout, or only the contents of its folder ``strip``, or only ``members``
    ((member, local path) pairs).  ``provides``: the files (or folders) relative to the
    dataset's folder that the download gives (default: ``name`` for a plain file).
    ``sha256`` / ``size``: of the download, where known (None: not verified).  ``optional``:
    those of ``provides`` that no default config reads (IMDb's 50,000 unlabelled reviews):
    the status report lists them but a folder without them is complete."""

    url: str
    name: str = ""
    sha256: str | None = None
    size: int | None = None
    archive: bool = False
    strip: str = ""
    members: tuple[tuple[str, str], ...] = ()
    provides: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", self.url.split("?")[0].rstrip("/").rsplit("/", 1)[1])
        if not self.provides:
            given = tuple(local for _, local in self.members) if self.members else (self.name,)
            object.__setattr__(self, "provides", given)


@dataclass(frozen=True)
class Dataset:
    """A registry entry: where the dataset's files go (``folder`` under the data root, the
    default folder of its DataModule), the downloads that give them and the files no
    download gives (``manual``, with ``how_to_get``).  ``datamodules``: the classes that read
    it (by name, for the status report; a DataModule names its entry in its ``dataset``
    attribute).  ``parts``: what shipped configs read instead of the whole release, as
    (which configs, the files relative to ``folder``): with those files there the dataset
    is usable by those configs (the status report's ``usable``;
    tests/experiments/test_nothing_lost.py checks the configs' files against them)."""

    key: str
    title: str
    folder: str
    downloads: tuple[Download, ...] = ()
    manual: tuple[str, ...] = ()
    how_to_get: str = ""
    checksums: str = "no sha256 published: unverified"
    datamodules: tuple[str, ...] = ()
    parts: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        """Every file of a complete folder (downloads unpacked, manual files)."""
        return tuple(p for d in self.downloads for p in d.provides) + self.manual

    @property
    def needed(self) -> tuple[str, ...]:
        """The files a default config reads: :attr:`files` but the downloads' optional ones."""
        return tuple(p for d in self.downloads for p in d.provides
                     if p not in d.optional) + self.manual

    def provider(self, relative: str) -> int | None:
        """The index of the download that gives ``relative`` (a posix path), or None."""
        for i, d in enumerate(self.downloads):
            if relative in d.provides:
                return i
        return None


def _splits(pattern: str, splits: Sequence[str], formats: Sequence[str] = ("",)) -> tuple:
    return tuple(pattern.format(split=s, fmt=f) for f in formats for s in splits)


STANFORD_NMT = "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/"
IWSLT_SHA = {  # (sha256, bytes) published by HF datasets (mt_eng_vietnamese)
    "train.en": ("c26dfeed74b6bf3752f5ca552f2412456f0de153f7c804df8717931fb3a5c78a", 13603614),
    "train.vi": ("707206edf2dc0280273952c7b70544ea8a1363aa69aaeb9d70514b888dc3067d", 18074646),
    "tst2012.en": ("b8fbcd0d4199d41276421d1f7228298df67dd9e2c5c134c2ee8cdf3ec27801e2", 140250),
    "tst2012.vi": ("01004078b3f36b0c46e81b65fc6851230b3c823405c76d1d82ef3b786b512ff0", 188396),
    "tst2013.en": ("3860ce60bc5b85d96cc2d3d580cf1bc9d62440e939c1b964676d3607c4e8f1df", 132264),
    "tst2013.vi": ("29af16842808da2812b8fd4d47fc05d082ba870e60ab7755090ad04b380994cd", 183855),
}
WMT14 = "http://www.statmt.org/wmt14/"
WMT16 = "http://data.statmt.org/wmt16/translation-task/"
LM1B = "1-billion-word-language-modeling-benchmark-r13output"
DROPBOX = "https://www.dropbox.com/s/"
ALGOLISP = {"train": "qhun6kml9yb2ui9", "dev": "aajkw83j2ps8bzx", "test": "f1x9ybkjpf371cp"}
QUASAR_T = "http://curtis.ml.cmu.edu/datasets/quasar/quasar-t/"


def _wmt(key: str, year: str, pair: tuple[str, str], dev: str, test: str, dev_url: str,
         test_url: str, test_folder: str, train_how: str, datamodule: str) -> Dataset:
    """A WMT task: the dev and test SGML of both directions, taken flat out of the release's
    dev / test archives; the training text is assembled by hand (``manual``)."""
    a, b = pair
    dev_files = [f"{dev}-src.{a}.sgm", f"{dev}-ref.{b}.sgm", f"{dev}-src.{b}.sgm",
                 f"{dev}-ref.{a}.sgm"]
    if year == "16":  # WMT'16 names each direction apart: newsdev2016-enro-src.en.sgm
        dev_files = [f"{dev}-{a}{b}-src.{a}.sgm", f"{dev}-{a}{b}-ref.{b}.sgm",
                     f"{dev}-{b}{a}-src.{b}.sgm", f"{dev}-{b}{a}-ref.{a}.sgm"]
        test_files = [f.replace(dev, test) for f in dev_files]
    else:  # WMT'14 names the pair once: newstest2014-deen-src.en.sgm
        test_files = [f"{test}-{b}{a}-src.{a}.sgm", f"{test}-{b}{a}-ref.{b}.sgm",
                      f"{test}-{b}{a}-src.{b}.sgm", f"{test}-{b}{a}-ref.{a}.sgm"]
    return Dataset(
        key, f"WMT'{year} {a.title()}-{b.title()}: dev/test sets (training text: by hand)",
        key,
        (Download(dev_url, name=f"wmt{year}-dev.tgz", archive=True,
                  members=tuple((f"dev/{f}", f) for f in dev_files)),
         Download(test_url, name=f"wmt{year}-{test_url.rsplit('/', 1)[1]}", archive=True,
                  members=tuple((f"{test_folder}/{f}", f) for f in test_files))),
        manual=(f"train.{a}", f"train.{b}"), how_to_get=train_how,
        datamodules=(datamodule,))


DATASETS: dict[str, Dataset] = {d.key: d for d in [
    # ---- NLI (datamodules/nli.py): the archive unpacked as it is (snli/snli_1.0/...)
    Dataset("snli", "SNLI 1.0", "snli", (Download(
        "https://nlp.stanford.edu/projects/snli/snli_1.0.zip", archive=True,
        sha256="afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e",
        size=94550081,
        provides=_splits("snli_1.0/snli_1.0_{split}.{fmt}", ("train", "dev", "test"),
                         ("jsonl", "txt"))),), checksums=HF_SHA,
        datamodules=("SNLIDataModule",),
        parts=(("the smoke configs of decomp_snli and coda_nli: the dev set's first 1,288 "
                "lines", ("snli_1.0_dev.first1288.jsonl",)),)),
    Dataset("multinli", "MultiNLI 1.0", "multinli_1.0", (Download(
        "https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip", archive=True,
        sha256="049f507b9e36b1fcb756cfd5aeb3b7a0cfcb84bf023793652987f7e7e0957822",
        size=226850426,
        provides=_splits("multinli_1.0/multinli_1.0_{split}.{fmt}",
                         ("train", "dev_matched", "dev_mismatched"), ("jsonl", "txt"))),),
        checksums=HF_SHA, datamodules=("MultiNLIDataModule",)),
    # HF datasets publish sha256 3fccd373...43d5 (14,174,621 bytes) for the same zip at
    # http://data.allenai.org.s3.amazonaws.com/downloads/SciTailV1.1.zip, not this URL
    Dataset("scitail", "SciTail 1.1", "SciTailV1.1", (Download(
        "https://ai2-public-datasets.s3.amazonaws.com/scitail/SciTailV1.1.zip", archive=True,
        provides=_splits("SciTailV1.1/tsv_format/scitail_1.0_{split}.tsv",
                         ("train", "dev", "test"))
        + _splits("SciTailV1.1/snli_format/scitail_1.0_{split}.txt",
                  ("train", "dev", "test"))),), datamodules=("SciTailDataModule",)),
    Dataset("dialogue_nli", "Dialogue NLI", "dialogue_nli",
            manual=_splits("dialogue_nli_{split}.jsonl", ("train", "dev", "test")),
            how_to_get="no direct URL: dialogue_nli.zip is on Google Drive (id "
                       "1WtbXCv3vPB5ql6w0FVDmAEMmWadbrCuG, https://wellecks.github.io/"
                       "dialogue_nli/); unzip it and put its .jsonl files in this folder",
            checksums="no download", datamodules=("DialogueNLIDataModule",)),
    # ---- ranking (datamodules/ranking.py)
    Dataset("wikiqa", "WikiQA, official release (format='tsv'; pass this folder as data_dir)",
            "wikiqa", (Download(
                "https://download.microsoft.com/download/E/5/F/"
                "E5FCFCEE-7005-4814-853D-DAA7C66507E0/WikiQACorpus.zip", archive=True,
                sha256="467c13f9e104552c0a9c16f41836ca8d89f9c0cc4b6e4355e104d5c3109ffa45",
                size=7094233,
                provides=_splits("WikiQACorpus/WikiQA-{split}.tsv", ("train", "dev", "test"))),),
            checksums=HF_SHA, datamodules=("WikiQADataModule",)),
    Dataset("wikiqa_filtered", "WikiQA, castorini's filtered version", "wikiqa/filtered",
            manual=tuple(f"{s}/{f}" for s in ("train", "dev", "test")
                         for f in ("a.toks", "b.toks", "sim.txt", "id.txt")),
            how_to_get="no official download: folder WikiQA/ of https://github.com/castorini/"
                       "data (clone it and copy train/, dev/, test/ here)",
            checksums="no download", datamodules=("WikiQADataModule",)),
    Dataset("trecqa", "TrecQA (jacana format)", "trecqa",
            manual=("TRAIN-ALL.xml", "TRAIN.xml", "DEV.xml", "TEST.xml"),
            how_to_get="no official download left: TrecQA/data/ of https://github.com/"
                       "castorini/data holds these files; copy them here",
            checksums="no download", datamodules=("TrecQADataModule",),
            parts=(("coda_ranking's smoke and cpu configs: TRAIN to train, DEV to test",
                    ("TRAIN.xml", "DEV.xml")),)),
    Dataset("ubuntu", "Ubuntu Dialogue Corpus v2 (pass this folder as data_dir)", "ubuntu",
            manual=("train.csv", "valid.csv", "test.csv"),
            how_to_get="no single download: build the v2 CSV files with https://github.com/"
                       "rkadlec/ubuntu-ranking-dataset-creator and put them here",
            checksums="no download", datamodules=("UbuntuDataModule",)),
    # ---- single-sequence text (datamodules/text.py): the archive's data folder's contents
    # the archive's aclImdb/ goes to imdb/aclImdb/; train/unsup (50,000 unlabelled reviews) is
    # read only by a config that asks for it (datamodules.imdb.read_aclimdb's folders)
    Dataset("imdb", "IMDb Large Movie Review Dataset v1.0", "imdb/aclImdb", (Download(
        "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz", archive=True,
        strip="aclImdb",
        sha256="c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe",
        size=84125825,
        provides=("README", "imdb.vocab", "train/neg", "train/pos", "train/unsup",
                  "test/neg", "test/pos"), optional=("train/unsup",)),), checksums=HF_SHA,
        datamodules=("IMDbDataModule",)),
    Dataset("sst", "Stanford Sentiment Treebank, PTB trees (format='ptb')", "sst_ptb", (Download(
        "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip", archive=True,
        strip="trees",
        sha256="5c613a4f673fc74097d523a2c83f38e0cc462984d847b82c7aaf36b01cbbbfcc",
        size=789539, provides=("train.txt", "dev.txt", "test.txt")),), checksums=HF_SHA,
        datamodules=("SSTDataModule",),
        parts=(("the smoke, repro and speed configs (format ptb): train and dev trees",
                ("train.txt", "dev.txt")),)),
    Dataset("sst2", "GLUE SST-2 (SSTDataModule format='glue')", "sst2_glue", (Download(
        "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip", archive=True, strip="SST-2",
        sha256="d67e16fb55739c1b32cdce9877596db1c127dc322d93c082281f64057c16deaa",
        size=7439277, provides=("train.tsv", "dev.tsv", "test.tsv")),), checksums=HF_SHA,
        datamodules=("SSTDataModule",),
        parts=(("coda_sentiment's smoke config: train.tsv cut 90/10",
                ("glue_sst2_train.part90.tsv", "glue_sst2_train.part10.tsv")),)),
    Dataset("sva", "Linzen et al. 2016 number prediction (rnn_agr_simple)",
            "linzen_agreement", (Download(
                "http://tallinzen.net/media/rnn_agreement/rnn_agr_simple.tar.gz", archive=True,
                strip="rnn_agr_simple",
                provides=("numpred.train", "numpred.val", "numpred.test")
                + tuple(f"numpred.test.{i}" for i in range(6))),),
            datamodules=("SVADataModule",),
            parts=(("dwin_classification's smoke config",
                    ("numpred.val", "numpred.test.5", "numpred.test.4")),)),
    Dataset("lm1b", "One Billion Word Benchmark (r13output)", LM1B, (Download(
        f"http://www.statmt.org/lm-benchmark/{LM1B}.tar.gz", archive=True, strip=LM1B,
        sha256="01ba60381110baf7f189dfd2b8374de371e8c9a340835793f190bdae9e90a34e",
        size=1792209805,
        provides=tuple(f"training-monolingual.tokenized.shuffled/news.en-{i:05d}-of-00100"
                       for i in range(1, 100))
        + tuple(f"heldout-monolingual.tokenized.shuffled/news.en.heldout-{i:05d}-of-00050"
                for i in range(50))),), checksums=HF_SHA, datamodules=("LM1BDataModule",)),
    # ---- translation (datamodules/iwslt.py, wmt.py, algolisp.py)
    Dataset("iwslt15", "IWSLT'15 En-Vi, Stanford NMT release", "iwslt15_en_vi", tuple(
        Download(STANFORD_NMT + name, sha256=IWSLT_SHA.get(name, (None, None))[0],
                 size=IWSLT_SHA.get(name, (None, None))[1])
        for name in ("train.en", "train.vi", "tst2012.en", "tst2012.vi", "tst2013.en",
                     "tst2013.vi", "vocab.en", "vocab.vi")),
        checksums=HF_SHA + " (train, tst2012, tst2013); vocab files: unverified",
        datamodules=("IWSLT15DataModule",),
        parts=(("the smoke configs of coda_mt and qadm_mt: the first 1,000 training pairs, "
                "tst2012, the vocabularies",
                ("train.first1000.en", "train.first1000.vi", "tst2012.en", "tst2012.vi",
                 "vocab.en", "vocab.vi")),)),
    _wmt("wmt14_en_de", "14", ("en", "de"), "newstest2013", "newstest2014", WMT14 + "dev.tgz",
         WMT14 + "test-full.tgz", "test-full",
         "no single archive of the training text: build train.en / train.de (Europarl v7 + "
         "Common Crawl + News Commentary v9, raw, one sentence per line) as fairseq's "
         "examples/translation/prepare-wmt14en2de.sh downloads them, and put them here",
         "WMT14DataModule"),
    _wmt("wmt14_en_fr", "14", ("en", "fr"), "newstest2013", "newstest2014", WMT14 + "dev.tgz",
         WMT14 + "test-full.tgz", "test-full",
         "no single archive of the training text: build train.en / train.fr (the WMT'14 "
         "En-Fr corpora, raw, one sentence per line) as fairseq's examples/translation/"
         "prepare-wmt14en2fr.sh downloads them, and put them here",
         "WMT14DataModule"),
    _wmt("wmt16_en_ro", "16", ("en", "ro"), "newsdev2016", "newstest2016", WMT16 + "dev.tgz",
         WMT16 + "test.tgz", "test",
         "no single archive of the training text: build train.en / train.ro (Europarl v8 + "
         "SETimes2, raw, one sentence per line) as rsennrich/wmt16-scripts' "
         "download_files.sh does, and put them here", "WMT16EnRoDataModule"),
    Dataset("algolisp", "AlgoLisp metaset3 (tensor2tensor's Dropbox files)", "algolisp", tuple(
        Download(f"{DROPBOX}{ALGOLISP[s]}/metaset3.{s}.jsonl.gz?dl=1", archive=True,
                 provides=(f"metaset3.{s}.jsonl",)) for s in ("train", "dev", "test")),
        datamodules=("AlgoLispDataModule",)),
    # ---- word vectors (datamodules/glove.py; NLI and ranking DataModules' ``vectors``)
    Dataset("glove", "GloVe 840B 300d vectors (the NLI and ranking DataModules' vectors)",
            "glove", (Download(
        "https://nlp.stanford.edu/data/glove.840B.300d.zip", archive=True,
        provides=("glove.840B.300d.txt",)),)),
    Dataset("mlu", "Mathematical Language Understanding", "mlu",
            how_to_get="nothing to download: the problems are generated from the documented "
                       "distribution (datamodules/mlu.py); the published file is not available",
            checksums="no download", datamodules=("MLUDataModule",)),
    # ---- open-domain QA (datamodules/open_qa.py)
    Dataset("searchqa", "SearchQA, the txt splits (Dunn et al. 2017)", "searchqa",
            manual=("train.txt", "val.txt", "test.txt"),
            how_to_get="no direct URL: the txt splits are in the Google Drive folder that "
                       "https://github.com/nyu-dl/dl4ir-searchQA links (id "
                       "0B51lBZ1gs1XTR3BIVTJQWkREQU0); put train.txt, val.txt and test.txt here",
            checksums="no download", datamodules=("SearchQADataModule",)),
    Dataset("quasar_t", "Quasar-T questions and short / long contexts (Dhingra et al. 2017)",
            "quasar_t", tuple(
                Download(f"{QUASAR_T}{kind}/{split}_{what}.json.gz",
                         name=f"{kind}/{split}_{what}.json.gz")
                for kind, what in (("questions", "questions"), ("contexts/short", "contexts"),
                                   ("contexts/long", "contexts"))
                for split in ("train", "dev", "test")),
            datamodules=("QuasarTDataModule",)),
]}


def url_of(key: str, index: int = 0) -> str:
    """The URL of a dataset's download (for the DataModules' ``url`` attributes)."""
    return DATASETS[key].downloads[index].url


def dataset_of(datamodule: Any) -> Dataset | None:
    """The registry entry a DataModule reads: the one its ``dataset`` attribute names (a
    class attribute, or a property where the settings choose the entry), None without one."""
    key = getattr(datamodule, "dataset", None)
    return DATASETS[key] if key is not None else None
