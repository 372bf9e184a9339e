"""The C++ libraries of attention/ (attention/_native.py): the structured CRF's and additive
attention's are each switched off by their own variable, in a fresh process, where supports()
then refuses every operand, so their callers take the other path (the window's and CoDA's
variables: test_window_kernels.py; each kernel against its other path: test_coda_kernels.py,
test_window_kernels.py, test_crf_chain.py, test_additive_pairs.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attention import _native

# (module, its variable, an expression of operands its kernels take)
LIBRARIES = [
    ("_crf_chain_ext", "ATTNREPRO_CRF_CPP", "torch.zeros(2, 3)"),
    ("_additive_ext", "ATTNREPRO_ADDITIVE_CPP", "torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), "
                                                "torch.zeros(4)"),
]


@pytest.mark.parametrize(("module", "variable", "operands"), LIBRARIES,
                         ids=[v for _, v, _ in LIBRARIES])
def test_switched_off_by_its_variable(module, variable, operands):
    if _native.compiler() is None:
        pytest.skip("no C++ compiler")
    code = (f"from attention import {module} as e; import torch; "
            f"print(e.LIBRARY.enabled, e.supports({operands}))")
    for value, expected in (("0", "False False"), ("1", "True True")):
        env = {**os.environ, variable: value, "ATTNREPRO_COMPILE": "1"}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == expected.split(), (variable, value)
