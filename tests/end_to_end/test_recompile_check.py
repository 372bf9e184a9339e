"""The recompile-limit check of the end-to-end logs (tests/end_to_end/conftest.py) finds
what dynamo really says when a compiled function has been compiled for too many shapes."""

from __future__ import annotations

import logging

import torch

from tests.conftest import recompile_limit_lines


def test_the_check_finds_dynamos_own_message(caplog):
    torch._dynamo.reset()

    def twice(x):
        return x * 2

    compiled = torch.compile(twice, dynamic=False, backend="eager")
    with torch._dynamo.config.patch(recompile_limit=2), caplog.at_level(logging.WARNING):
        for n in range(1, 6):
            compiled(torch.ones(n))
    torch._dynamo.reset()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert recompile_limit_lines(text), text
    assert not recompile_limit_lines("step 20/40  loss 2.31\nrecompiled nothing")
