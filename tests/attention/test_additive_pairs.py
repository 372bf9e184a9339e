"""Additive attention's C++ scores (attention/_additive_pairs.cpp: u . tanh(wq_i + vk_j) without
the pairwise tensor, and its backward pass) against the blocked tanh tensor with autograd
(attention/additive.py's other path, which test_additive.py checks against loops): values and
the three gradients at the shapes of every context (multi-head with one u per head, a decoder
step of one query row, pairwise alignment with one u), key counts that fill no whole vector,
saturated and tiny tanh arguments, float32 against float64, any number of threads (the
variable that turns them off: test_native.py)."""

from __future__ import annotations

import pytest
import torch

from attention import _additive_ext
from attention.additive import additive_scores
from tests.conftest import break_native_library, use_native_library


@pytest.fixture(autouse=True)
def native(monkeypatch):
    use_native_library(monkeypatch, _additive_ext.LIBRARY)


def blocked(wq, vk, u):
    """The blocked tanh tensor, the kernels off."""
    _additive_ext.LIBRARY.enabled = False
    try:
        return additive_scores(wq, vk, u, block_elements=64)
    finally:
        _additive_ext.LIBRARY.enabled = True


def values_and_grads(fn, wq, vk, u, grad):
    leaves = [x.detach().requires_grad_() for x in (wq, vk, u)]
    out = fn(*leaves)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad))


# (wq, vk, u) shapes: multi-head (u per head), decoder step (one query row), alignment (one u),
# broadcast batch (keys shared by a batch of queries), and the degenerate sizes
SHAPES = {
    "multihead": ((2, 3, 9, 8), (2, 3, 11, 8), (3, 8)),
    "decoder-step": ((4, 1, 6), (4, 23, 6), (6,)),
    "alignment": ((2, 17, 5), (2, 33, 5), (5,)),
    "broadcast-keys": ((3, 2, 7, 4), (1, 2, 5, 4), (2, 4)),
    "one-key": ((2, 5, 3), (2, 1, 3), (3,)),
    "one-dim": ((2, 4, 1), (2, 16, 1), (1,)),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("lk", [None, 1, 2, 15, 16, 17, 40])
def test_scores_and_grads_equal_blocked(shape, lk):
    sq, sk, su = shape
    if lk is not None:
        sk = (*sk[:-2], lk, sk[-1])
    g = torch.Generator().manual_seed(len(sk) * 100 + sk[-2])
    wq = 2 * torch.randn(sq, generator=g, dtype=torch.float64)
    vk = 2 * torch.randn(sk, generator=g, dtype=torch.float64)
    u = torch.randn(su, generator=g, dtype=torch.float64)
    grad = torch.randn(torch.broadcast_shapes(sq[:-2], sk[:-2], su[:-1]) + (sq[-2], sk[-2]),
                       generator=g, dtype=torch.float64)
    ours = values_and_grads(additive_scores, wq, vk, u, grad)
    theirs = values_and_grads(blocked, wq, vk, u, grad)
    for name, a, b in zip(["scores", "d wq", "d vk", "d u"], ours, theirs):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)


def test_saturated_and_tiny_arguments():
    """|wq + vk| from 1e-9 to 60 (tanh saturated at 1 beyond about 20), both signs."""
    x = torch.tensor([0.0, 1e-9, -1e-9, 1e-4, 0.3, -0.7, 5.0, -19.9, 20.1, -35.0, 60.0],
                     dtype=torch.float64)
    wq = x.view(1, -1, 1)
    vk = torch.tensor([[0.0], [1e-6], [-2.0]], dtype=torch.float64).view(1, 3, 1)
    u = torch.tensor([1.5], dtype=torch.float64)
    exact = 1.5 * torch.tanh(wq + vk.transpose(-1, -2))
    torch.testing.assert_close(additive_scores(wq, vk, u), exact, rtol=0, atol=1e-15)
    torch.testing.assert_close(additive_scores(wq.float(), vk.float(), u.float()),
                               exact.float(), rtol=0, atol=5e-7)


def test_nan_propagates():
    wq = torch.tensor([[[float("nan")], [1.0]]])
    out = additive_scores(wq, torch.zeros(1, 3, 1), torch.ones(1))
    assert out[0, 0].isnan().all() and not out[0, 1].isnan().any()


def test_float32_is_float64_rounded():
    g = torch.Generator().manual_seed(5)
    wq, vk = torch.randn(2, 4, 30, 32, generator=g), torch.randn(2, 4, 50, 32, generator=g)
    u, grad = torch.randn(4, 32, generator=g), torch.randn(2, 4, 30, 50, generator=g)
    low = values_and_grads(additive_scores, wq, vk, u, grad)
    high = values_and_grads(additive_scores, wq.double(), vk.double(), u.double(), grad.double())
    for name, a, b in zip(["scores", "d wq", "d vk", "d u"], low, high):
        assert a.dtype == torch.float32
        scale = b.abs().max().item()
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-6 * max(1.0, scale), msg=name)


def test_gradcheck():
    g = torch.Generator().manual_seed(6)
    wq = torch.randn(2, 2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    vk = torch.randn(2, 2, 19, 4, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(additive_scores, (wq, vk, u))


def test_threads_give_identical_bits():
    g = torch.Generator().manual_seed(7)
    wq, vk = torch.randn(3, 4, 40, 16, generator=g), torch.randn(3, 4, 37, 16, generator=g)
    u, grad = torch.randn(4, 16, generator=g), torch.randn(3, 4, 40, 37, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = values_and_grads(additive_scores, wq, vk, u, grad)
        torch.set_num_threads(3)
        three = values_and_grads(additive_scores, wq, vk, u, grad)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, three):
        assert torch.equal(a, b)


def test_not_twice_differentiable():
    wq = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    vk, u = torch.randn(1, 5, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    (d_wq,) = torch.autograd.grad(additive_scores(wq, vk, u).pow(2).sum(), wq, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|backward"):
        d_wq.sum().backward()


def test_other_dtypes_and_empty_operands_take_the_blocked_path():
    assert not _additive_ext.supports(torch.zeros(1, 2, 3, dtype=torch.bfloat16),
                                      torch.zeros(1, 4, 3, dtype=torch.bfloat16),
                                      torch.zeros(3, dtype=torch.bfloat16))
    assert not _additive_ext.supports(torch.zeros(1, 0, 3), torch.zeros(1, 4, 3), torch.zeros(3))
    assert additive_scores(torch.zeros(1, 0, 3), torch.zeros(1, 4, 3), torch.zeros(3)).shape \
        == (1, 0, 4)
    low = additive_scores(torch.ones(1, 2, 3, dtype=torch.bfloat16),
                          torch.ones(1, 4, 3, dtype=torch.bfloat16),
                          torch.ones(3, dtype=torch.bfloat16))
    assert low.dtype == torch.bfloat16 and low.shape == (1, 2, 4)


def test_a_failed_build_warns_once_and_the_blocked_path_runs(monkeypatch, tmp_path):
    g = torch.Generator().manual_seed(8)
    wq, vk, u = (torch.randn(2, 3, 5, 4, generator=g), torch.randn(2, 3, 6, 4, generator=g),
                 torch.randn(3, 4, generator=g))
    want = blocked(wq, vk, u)
    break_native_library(monkeypatch, tmp_path, _additive_ext.LIBRARY)
    with pytest.warns(UserWarning, match="additive attention's C.. scores failed"):
        got = additive_scores(wq, vk, u)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not _additive_ext.supports(wq, vk, u)  # warned once: no second build
