"""Structured attention's C++ chain (attention/_crf_chain.cpp: the segmentation CRF's scaled
forward-backward, and its backward pass by the expectation semiring) against the log-space
Python recursion with autograd (attention/structured.py), which test_structured.py checks
against enumeration: values and both gradients at the shapes of a training step (multi-head
causal and padded rows, holes, empty rows, chains of 1 to 70 positions), float32 against
float64, any number of threads, and the log-space fallback for chains out of the kernel's
range."""

from __future__ import annotations

import pytest
import torch

from attention import _crf_chain_ext
from attention.structured import (
    crf_marginals,
    log_space_attention,
    log_space_marginals,
    segmentation_attention,
)
from tests.conftest import use_native_library


@pytest.fixture(autouse=True)
def native(monkeypatch):
    use_native_library(monkeypatch, _crf_chain_ext.LIBRARY)


def masks(b: int, h: int, n: int) -> dict[str, torch.Tensor | None]:
    """The masks a chain meets: none, causal rows, key padding (one sequence empty), holes."""
    padding = torch.ones(b, 1, 1, n, dtype=torch.bool)
    padding[0, ..., n // 2:] = False
    padding[-1] = False  # an empty sequence: every chain without a real position
    holes = torch.rand(b, h, n, n, generator=torch.Generator().manual_seed(3)) > 0.3
    return {"none": None, "causal": torch.ones(n, n, dtype=torch.bool).tril(),
            "padding": padding, "holes": holes}


def values_and_grads(fn, theta, transition, grad):
    theta = theta.detach().requires_grad_()
    transition = transition.detach().requires_grad_()
    out = fn(theta, transition)
    d_theta, d_transition = torch.autograd.grad(out, (theta, transition), grad)
    return out.detach(), d_theta, d_transition


@pytest.mark.parametrize("n", [1, 2, 9, 70])
@pytest.mark.parametrize("kind", ["none", "causal", "padding", "holes"])
@pytest.mark.parametrize("normalise", [True, False], ids=["weights", "marginals"])
def test_chain_equals_log_space_recursion(n, kind, normalise):
    g = torch.Generator().manual_seed(n)
    theta = 3 * torch.randn(3, 2, n, n, generator=g, dtype=torch.float64)
    transition = torch.randn(2, 2, generator=g, dtype=torch.float64)
    grad = torch.randn(3, 2, n, n, generator=g, dtype=torch.float64)
    mask = masks(3, 2, n)[kind]
    if normalise:
        fast = lambda t, w: segmentation_attention(t, w, mask, 1.7)  # noqa: E731
        slow = lambda t, w: log_space_attention(t, w, mask, 1.7)  # noqa: E731
    else:
        fast = lambda t, w: crf_marginals(t, w, mask)  # noqa: E731
        slow = lambda t, w: log_space_marginals(t, w, mask)  # noqa: E731
    for got, want in zip(values_and_grads(fast, theta, transition, grad),
                         values_and_grads(slow, theta, transition, grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    if mask is not None:  # masked positions exactly 0, and their gradients
        out, d_theta, _ = values_and_grads(fast, theta, transition, grad)
        off = ~torch.broadcast_to(mask, theta.shape)
        assert not out[off].any() and not d_theta[off].any()


def test_float32_chain_is_the_float64_one_rounded():
    """float32 scores are worked in double inside the kernel: the float32 results are the
    float64 ones to float32 rounding (the log-space float32 recursion is further off)."""
    g = torch.Generator().manual_seed(0)
    theta = 4 * torch.randn(2, 4, 64, 64, generator=g, dtype=torch.float64)
    transition = torch.randn(2, 2, generator=g, dtype=torch.float64)
    grad = torch.randn(2, 4, 64, 64, generator=g, dtype=torch.float64)
    mask = masks(2, 4, 64)["causal"]
    fn = lambda t, w: segmentation_attention(t, w, mask)  # noqa: E731
    want = values_and_grads(fn, theta, transition, grad)
    got = values_and_grads(fn, theta.float(), transition.float(), grad.float())
    for x, y in zip(got, want):
        assert x.dtype == torch.float32
        torch.testing.assert_close(x.double(), y, rtol=2e-5, atol=1e-6)


def test_results_do_not_depend_on_threads():
    """Bit for bit the same with 1 and 3 threads (dL/dW is summed in blocks of 64 chains,
    then in order), over more chains than one block."""
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(4, 4, 50, 50, generator=g)
    transition = torch.randn(2, 2, generator=g)
    grad = torch.randn(4, 4, 50, 50, generator=g)
    mask = masks(4, 4, 50)["padding"]
    fn = lambda t, w: segmentation_attention(t, w, mask)  # noqa: E731
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = values_and_grads(fn, theta, transition, grad)
        torch.set_num_threads(3)
        three = values_and_grads(fn, theta, transition, grad)
    finally:
        torch.set_num_threads(threads)
    for x, y in zip(one, three):
        assert torch.equal(x, y)


def test_chains_out_of_range_take_the_log_space_recursion():
    """A chain whose every score is about -1000 has marginals below double's range: the
    kernel reports it and the log-space recursion gives the weights (finite, summing to lam)
    and their gradients."""
    theta = torch.full((2, 6), -1000.0, dtype=torch.float64)
    theta[1] = torch.linspace(-3, 3, 6)
    theta[0, 2] = -990.0
    transition = torch.randn(2, 2, generator=torch.Generator().manual_seed(2),
                             dtype=torch.float64)
    grad = torch.randn(2, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with pytest.raises(_crf_chain_ext.OutOfRange):
        _crf_chain_ext._Chain.apply(theta, transition, None, True, 2.0)
    fast = values_and_grads(lambda t, w: segmentation_attention(t, w), theta, transition, grad)
    slow = values_and_grads(lambda t, w: log_space_attention(t, w, None, 2.0), theta,
                            transition, grad)
    for x, y in zip(fast, slow):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y)
    torch.testing.assert_close(fast[0].sum(-1), torch.full((2,), 2.0, dtype=torch.float64))
    assert fast[0][0, 2] > 1.99  # the one score 10 above the others takes the weight


def test_not_twice_differentiable_says_so():
    theta = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    transition = torch.randn(2, 2, dtype=torch.float64)
    (d_theta,) = torch.autograd.grad(segmentation_attention(theta, transition).pow(2).sum(),
                                     theta, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|backward"):
        d_theta.sum().backward()
