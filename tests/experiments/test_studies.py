"""What the notebooks' studies share (experiments/harness/studies.py): the first training losses
recorded for the notebook test's check line, the check line itself, Lightning's INFO lines kept
out of a notebook's output, and the compact figures a notebook stores."""

from __future__ import annotations

import io
import json
import logging

import lightning as L
import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from experiments.harness.studies import (
    CHECK,
    FIRST_STEPS,
    LIGHTNING_INFO,
    compact_png,
    first_losses,
    prepared,
    print_check,
    train_briefly,
)


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)


class Data(L.LightningDataModule):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(64, 3, generator=g)
        self.data = TensorDataset(x, x.sum(-1, keepdim=True))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=8)  # in order: the first batch is known


def test_first_losses_are_the_first_steps_of_every_run_in_the_block():
    data = Data()
    torch.manual_seed(0)
    first = Regression()
    x, y = next(iter(data.train_dataloader()))
    with torch.no_grad():
        before = float(torch.nn.functional.mse_loss(first.net(x), y))
    train_briefly(Regression(), data, 3)  # outside any block: recorded nowhere
    with first_losses() as outer:
        train_briefly(first, data, FIRST_STEPS + 3)
        with first_losses() as inner:
            train_briefly(Regression(), data, 2)
    assert len(outer) == 2 and len(inner) == 1
    assert list(outer[0]) == list(range(1, FIRST_STEPS + 1))
    assert outer[0][1] == before  # step 1's loss: the batch it trains on, before its update
    assert outer[0][FIRST_STEPS] < outer[0][1]  # and later steps' losses are after updates
    assert outer[1] is inner[0] and list(inner[0]) == [1, 2]


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_training_prints_no_lightning_info_and_restores_the_loggers():
    records = Records()
    loggers = [logging.getLogger(name) for name in LIGHTNING_INFO]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(records)
    try:
        train_briefly(Regression(), Data(), 2)
        logging.getLogger(LIGHTNING_INFO[0]).warning("a warning still shows")
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    assert records.messages == ["a warning still shows"]
    assert [logger.level for logger in loggers] == levels


def test_a_study_prepares_its_data_without_the_data_warnings(caplog):
    class Warns(L.LightningDataModule):
        def setup(self, stage):
            logging.getLogger("datamodules.nli").warning("dropped 12 pairs without gold label")
            logging.getLogger("datamodules.nli").error("a file is unreadable")

    logger = logging.getLogger("datamodules")
    level = logger.level
    with caplog.at_level(logging.INFO):
        prepared(Warns())
    assert [r.getMessage() for r in caplog.records] == ["a file is unreadable"]
    assert logger.level == level


def test_print_check_is_one_line_of_json_rounded(capsys):
    print_check(steps=20, losses=[{1: 0.123456789}], words=("bạn", "."),
                nested={("a", 1): 2.0 / 3})
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(CHECK + " ")
    assert "bạn" in out  # not escaped: readable in the notebook
    assert json.loads(out[len(CHECK):]) == {"steps": 20, "losses": [{"1": 0.1235}],
                                            "words": ["bạn", "."],
                                            "nested": {"('a', 1)": 0.6667}}


def test_compact_png_keeps_the_figure_in_fewer_bytes(tmp_path):
    fig = Figure(figsize=(6, 4))
    for ax, cmap in zip(fig.subplots(1, 3), ("RdBu", "viridis", "magma")):
        image = ax.imshow(np.random.default_rng(0).random((12, 12)), cmap=cmap)
        fig.colorbar(image, ax=ax)
        ax.set_title(f"{cmap} map")
    path = tmp_path / "figure.png"
    fig.savefig(path, dpi=100)
    compact = compact_png(path)
    with Image.open(path) as original, Image.open(io.BytesIO(compact)) as shown:
        assert shown.format == "PNG" and shown.mode == "P" and shown.size == original.size
        difference = np.abs(np.asarray(shown.convert("RGB"), dtype=float)
                            - np.asarray(original.convert("RGB"), dtype=float))
    assert len(compact) < path.stat().st_size / 2
    # of 255: nothing a reader sees is lost, and the colour bars have no bands (a median
    # cut's palette is off by 23 on this figure, the maximum coverage one by 9)
    assert difference.mean() < 2 and difference.max() < 16
