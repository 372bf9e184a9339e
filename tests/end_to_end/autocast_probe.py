"""A Lightning callback the bf16-mixed tests (tests/end_to_end/test_bf16_mixed.py) add to an
experiment script's run (``--trainer.callbacks+=tests.end_to_end.autocast_probe.AutocastProbe``
with the project root on PYTHONPATH): what the training forward passes really ran in, seen
from inside the process, not from the config asked for.

During every training forward pass, a hook on each submodule records whether CPU autocast
was on and with which dtype, and the dtypes of the floating-point tensors the submodule
returned; after every training step, the loss.  At the end of fit the record is written as
JSON to the file named by ``ATTNREPRO_TEST_AUTOCAST_PROBE``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import lightning as L
import torch


def _tensors(value):
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


class AutocastProbe(L.Callback):
    def __init__(self):
        self.autocast: set[str] = set()
        self.outputs: set[str] = set()
        self.losses: list[float] = []
        self._handles: list = []

    def _hook(self, module, args, output) -> None:
        if not module.training:
            return
        self.autocast.add(str(torch.get_autocast_dtype("cpu"))
                          if torch.is_autocast_enabled("cpu") else "off")
        self.outputs.update(str(t.dtype) for t in _tensors(output) if t.is_floating_point())

    def on_fit_start(self, trainer, pl_module) -> None:
        self._handles = [m.register_forward_hook(self._hook) for m in pl_module.modules()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))

    def on_fit_end(self, trainer, pl_module) -> None:
        for handle in self._handles:
            handle.remove()
        record = {"autocast": sorted(self.autocast), "output_dtypes": sorted(self.outputs),
                  "losses": [x if math.isfinite(x) else str(x) for x in self.losses]}
        Path(os.environ["ATTNREPRO_TEST_AUTOCAST_PROBE"]).write_text(json.dumps(record))
