"""Every end-to-end test runs paper configs' smoke grids and fits; after each, no log it left
(the runs' ``output.log``, and the output of every script it ran, checked in
tests/conftest.py's ``finish``) may say that torch.compile hit its recompile limit: a kernel
compiled anew for each shape until dynamo gives up and runs it eagerly (issue 50 item 1)."""

from __future__ import annotations

import pytest

from tests.conftest import recompile_limit_lines


@pytest.fixture(autouse=True)
def no_recompile_limit_in_run_logs(request):
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if root is None:
        return
    hits = [f"{path}:{line}" for path in sorted(root.rglob("output.log"))
            for line in recompile_limit_lines(path.read_text(errors="replace"))]
    assert not hits, "torch.compile hit its recompile limit: " + "; ".join(hits)
