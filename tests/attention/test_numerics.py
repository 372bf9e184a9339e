"""Numerics (issue 16, point 6): nothing NaN or Inf comes out of a mechanism or its gradient,
and a NaN or infinite training loss stops training with one clear line.

(a) Fully masked rows: every registered mechanism and variant (the contract tests'
    enumeration, tests/attention/test_contracts.py) in every context it supports, in float32 with
    the
    default fast paths (torch.compile'd kernels, CoDA's C++ kernels): one example of the
    batch fully padded, and query rows with nothing to attend to beside rows that have
    something (causal attention over a left-padded sequence, padded tokens in alignment).
    Outputs, weights and the gradients of every input and parameter are finite, and a row
    with nothing to attend to outputs exactly 0 (masking.masked_attention's contract, which
    every mechanism keeps; test_softmax.py, test_coda.py and test_window.py state it for one
    mechanism each).
(b) bfloat16 autocast (what ``precision="bf16-mixed"`` runs): each mechanism's multi-head
    self-attention at L=1024 (two shorter: see the test), forward and backward, and the eager
    fallbacks of the mechanisms with kernels of their own (CoDA, window): finite, and within
    a few percent of float32; every variant's pairwise alignment and decoder attention (all
    steps, one step) on bfloat16 inputs, the same.  The kernels' backward passes also run
    when ``backward()`` is called inside the autocast region, and in a model cast to
    bfloat16.  Whole models with ``--trainer.precision bf16-mixed``:
    tests/end_to_end/test_bf16_mixed.py.
(c) A NaN or infinite training loss stops ``Trainer.fit`` with
    lit_models.base.NonFiniteLossError, naming the step and the last finite loss, for every
    model, also when one of two DDP processes has it; the latent mixture's routing
    distribution and reward, needed before its loss exists, are checked the same way; a
    finite run is unchanged by the check.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from attention import REGISTRY, MultiHeadAttention, build
from attention.masking import attention_mask
from lit_models.base import AttnReproModule, NonFiniteLossError
from lit_models.decomp_att import DecompAtt
from lit_models.mixture import Mixture
from tests.attention.test_contracts import D_MODEL, DIM, N_HEADS, cases, decoder, refused
from tests.lit_models.test_decomp_att import PAIRS, batch_of
from tests.lit_models.test_rnn_seq2seq import batch as rnn_batch
from tests.lit_models.test_rnn_seq2seq import model as rnn_model
from tests.lit_models.test_transformer import small_model as seq2seq_model
from tests.lit_models.test_transformer_classifier_lm import classifier, language_model, padded_batch

compiled = importlib.import_module("attention._compiled")
DT = torch.float32  # what training uses


@pytest.fixture(autouse=True)
def one_thread():
    """One thread: nothing here is large, and the many small sequential operations (the
    structured CRF's steps, tiny Lightning runs) slowed down tenfold with two threads on a
    busy machine (measured: structured at L=512, 1.7 s vs 18 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def randn(*shape, g):
    return torch.randn(*shape, generator=g, dtype=DT)


def masks(*rows: str) -> torch.Tensor:
    """Boolean masks from strings: '1' a real token, '.' padding."""
    return torch.tensor([[c == "1" for c in row] for row in rows])


def assert_finite(what: str, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None:
            assert torch.isfinite(t).all(), f"{what}: {name} has NaN or Inf"


def backward_is_finite(what: str, outputs, inputs, module: torch.nn.Module) -> None:
    """A random cotangent of every output back to the inputs and parameters: all finite."""
    g = torch.Generator().manual_seed(9)
    loss = sum((o.float() * randn(*o.shape, g=g)).sum() for o in outputs if o is not None)
    loss.backward()
    assert_finite(what, **{f"the gradient of input {i}": x.grad for i, x in enumerate(inputs)},
                  **{f"the gradient of {name}": p.grad for name, p in module.named_parameters()})


# -- (a) fully masked rows ---------------------------------------------------------------------
#: key masks: example 0 padded on both sides (causal query 0 sees only padding), 1 fully padded
SELF_MASK = masks(".1111.", "......")
CROSS_MASK = masks("1111...", ".......")  # the source (5 target positions attend to it)
#: alignment: padded tokens on both sides in example 0; a fully padded in 1, b in 2
A_MASK, B_MASK = masks("11.1.", ".....", "11111"), masks("1.11", "1111", "....")
DECODER_MASK = masks("111.", "....")  # example 1: a fully padded memory

MASKED_CASES = (cases("multihead", ("self", "causal", "cross")) + cases("alignment", ("pairs",))
                + cases("decoder", ("all steps", "one step")))


def multihead_rows(mechanism, mode: str, g) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_MODEL, N_HEADS, mechanism,
                             self_attention=mode != "cross").to(DT).eval()
    key_mask = CROSS_MASK if mode == "cross" else SELF_MASK
    keys = randn(*key_mask.shape, D_MODEL, g=g).requires_grad_()
    queries = (randn(len(key_mask), 5, D_MODEL, g=g).requires_grad_() if mode == "cross"
               else keys)
    core = {}  # the per-head output (B,H,Lq,dv), before the output projection adds its bias
    mha.core.register_forward_hook(lambda module, args, out: core.update(out=out[0]))
    out, weights = mha(queries, keys, key_mask, causal=mode == "causal", need_weights=True)
    what = f"{mechanism.tag()}, {mode}"
    assert_finite(what, out=out, weights=weights, per_head=core["out"])
    lq, lk = queries.shape[1], keys.shape[1]
    visible = attention_mask(key_mask, lq, lk, mode == "causal").expand(len(key_mask), 1, lq, lk)
    empty = ~visible.any(-1)  # (B,1,Lq): queries with no visible key
    assert empty.any() and (core["out"].masked_select(empty[..., None]) == 0).all(), \
        f"{what}: a query with no visible key must output 0"
    assert (weights.masked_select(empty[..., None]) == 0).all()
    backward_is_finite(what, (out, weights), (queries, keys) if mode == "cross" else (keys,), mha)


def alignment_rows(mechanism, g) -> None:
    core = mechanism.alignment(dim=DIM).to(DT).eval()
    a = randn(*A_MASK.shape, DIM, g=g).requires_grad_()
    b = randn(*B_MASK.shape, DIM, g=g).requires_grad_()
    value_a, value_b = (randn(*m.shape, 3, g=g).requires_grad_() for m in (A_MASK, B_MASK))
    res = core(a, b, A_MASK, B_MASK, value_a=value_a, value_b=value_b)
    what = f"{mechanism.tag()}, alignment"
    assert_finite(what, **res._asdict())
    # a padded token, or one whose other sequence is all padding, aligns with nothing
    a_empty = ~(A_MASK & B_MASK.any(1, keepdim=True))  # (B,La)
    b_empty = ~(B_MASK & A_MASK.any(1, keepdim=True))  # (B,Lb)
    assert (res.a_aligned[a_empty] == 0).all() and (res.b_aligned[b_empty] == 0).all(), \
        f"{what}: a token with nothing to align with must get 0"
    assert (res.weights_a[a_empty] == 0).all()
    assert (res.weights_b.transpose(1, 2)[b_empty] == 0).all()
    backward_is_finite(what, res, (a, b, value_a, value_b), core)


def decoder_rows(mechanism, mode: str, g) -> None:
    core, s, h, _ = decoder(mechanism)  # the contract tests' core and sizes, float64
    core = core.to(DT).eval()
    s = s[:len(DECODER_MASK), :3].to(DT).requires_grad_()
    h = randn(*DECODER_MASK.shape, h.shape[-1], g=g).requires_grad_()
    memory = core.precompute(h, DECODER_MASK)
    if mode == "all steps":
        context, weights = core(s, memory)
    else:
        context, weights = (torch.stack(x, 1) for x in
                            zip(*(core.step(s[:, t], memory) for t in range(s.shape[1]))))
    what = f"{mechanism.tag()}, decoder {mode}"
    assert_finite(what, context=context, weights=weights)
    empty = ~DECODER_MASK.any(1)
    assert (context[empty] == 0).all() and (weights[empty] == 0).all(), \
        f"{what}: a step over a fully padded memory must output 0"
    backward_is_finite(what, (context, weights), (s, h), core)


@pytest.mark.parametrize("mechanism,mode", MASKED_CASES)
def test_fully_masked_rows_are_finite_and_zero(mechanism, mode):
    error = refused(mechanism, mode)
    if error is not None:  # test_contracts.py checks the error itself
        pytest.skip(f"{mechanism.tag()} refuses {mode} attention (documented: {error[1]!r})")
    g = torch.Generator().manual_seed(1)
    if mode == "pairs":
        alignment_rows(mechanism, g)
    elif mode in ("all steps", "one step"):
        decoder_rows(mechanism, mode, g)
    else:
        multihead_rows(mechanism, mode, g)


# -- (b) bfloat16 autocast at L=1024 -----------------------------------------------------------
LENGTH = 1024
#: shorter where L=1024 takes far more than a few seconds (test_bf16_autocast_is_finite)
SHORTER = {"density(scheme=aqt)": 128, "structured": 512}
BF16_CASES = ([pytest.param(m, "default", SHORTER.get(m.tag(), LENGTH), id=m.tag())
               for m in [build(name) for name in REGISTRY] + [build("density", scheme="aqt")]]
              + [pytest.param(build("coda"), "eager", LENGTH, id="coda-eager"),
                 pytest.param(build("window"), "eager", LENGTH, id="window-eager"),
                 pytest.param(build("structured"), "default", LENGTH, id="structured-1024",
                              marks=pytest.mark.slow)])


@pytest.mark.parametrize("mechanism,path,length", BF16_CASES)
def test_bf16_autocast_is_finite(mechanism, path, length, monkeypatch):
    """Multi-head self-attention (B=1, H=2, d=16) at L=1024 with its last quarter padded,
    under bfloat16 autocast: finite output and gradients of the input and every parameter,
    and the output within 3% of float32's (measured: under 1% for every mechanism).

    Two run shorter (SHORTER), forward + backward on one core being far beyond a few
    seconds at 1024: density AQT at L=128 (its multi-head cost is Lq x Lk^2 x d, cubic:
    L=1024 did not finish in 60 s, 128 takes 1-3 s), and structured at L=512 (its CRF runs
    L sequential forward-backward steps: 10-16 s at 1024, under 2 s at 512; L=1024 is the
    case marked slow).  ``eager``: ATTNREPRO_COMPILE=0, CoDA's and the window's
    fallback without torch.compile or C++ kernels (before the fix CoDA's crashed in its
    forward pass, the window's in its backward pass on both paths)."""
    if path == "eager":
        monkeypatch.setattr(compiled, "COMPILE", False)
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 2, mechanism)
    g = torch.Generator().manual_seed(2)
    x = randn(1, length, 32, g=g).requires_grad_()
    mask = (torch.arange(length) < length - length // 4)[None, :]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = mha(x, x, mask)
    assert out.dtype == torch.bfloat16  # autocast ran (the output projection in bfloat16)
    what = f"{mechanism.tag()} ({path}) under bf16 autocast, L={length}"
    assert_finite(what, out=out)
    backward_is_finite(what, (out,), (x,), mha)
    with torch.no_grad():
        reference, _ = mha(x, x, mask)
    error = (out.float() - reference).abs().max() / reference.abs().max()
    assert error < 0.03, f"{what}: {error:.3g} of the largest output away from float32's"


@pytest.mark.parametrize("precision", ["backward under autocast", "bfloat16 weights"])
@pytest.mark.parametrize("path", ["default", "eager"])
@pytest.mark.parametrize("name", ["coda", "window"])
def test_kernels_take_bfloat16_either_way(name, path, precision, monkeypatch):
    """CoDA's and the window's custom autograd functions compute bfloat16 in float32, also
    with ``backward()`` called inside the autocast region (the engine then runs backward
    passes under autocast: the window's crashed, "Input dtypes must be the same") and in a
    model cast to bfloat16 (``precision="bf16-true"``, no autocast: CoDA's eager path
    crashed, torch.cdist has no bfloat16 kernel), whose output stays bfloat16."""
    if path == "eager":
        monkeypatch.setattr(compiled, "COMPILE", False)
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 2, build(name))
    x = randn(1, 64, 32, g=torch.Generator().manual_seed(3))
    what = f"{name} ({path}), {precision}"
    if precision == "bfloat16 weights":
        mha, x = mha.to(torch.bfloat16), x.to(torch.bfloat16).requires_grad_()
        out, _ = mha(x, x)
        assert out.dtype == torch.bfloat16
        backward_is_finite(what, (out,), (x,), mha)
        return
    x.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = mha(x, x)
        backward_is_finite(what, (out,), (x,), mha)


#: the contexts beside multi-head attention, every variant that supports them
CONTEXT_CASES = cases("alignment", ("pairs",)) + cases("decoder", ("all steps", "one step"))


@pytest.mark.parametrize("mechanism,mode", CONTEXT_CASES)
def test_other_contexts_under_bf16_autocast(mechanism, mode):
    """Pairwise alignment (DecompAtt) and decoder attention (the RNN translator, all steps
    and one step after ``precompute``) under bfloat16 autocast, with bfloat16 inputs as a
    model's bf16 layers hand them over (test_bf16_autocast_is_finite covers multi-head
    attention): finite outputs and gradients of the inputs and every parameter, and within
    5% of the largest float32 output (measured: at most 2.7%, the window's alignment), on
    the padded batches of (a)."""
    g = torch.Generator().manual_seed(4)
    if mode == "pairs":
        core = mechanism.alignment(dim=DIM).to(DT)
        a, b = randn(*A_MASK.shape, DIM, g=g), randn(*B_MASK.shape, DIM, g=g)
        value_a, value_b = randn(*A_MASK.shape, 3, g=g), randn(*B_MASK.shape, 3, g=g)

        def run(*xs):
            return tuple(core(xs[0], xs[1], A_MASK, B_MASK, value_a=xs[2], value_b=xs[3]))

        inputs = (a, b, value_a, value_b)
    else:
        core, s, h, _ = decoder(mechanism)
        core = core.to(DT)
        inputs = (s[:len(DECODER_MASK)].to(DT), randn(*DECODER_MASK.shape, h.shape[-1], g=g))

        def run(s, h):
            memory = core.precompute(h, DECODER_MASK)
            if mode == "all steps":
                return core(s, memory)
            return tuple(torch.stack(x, 1) for x in
                         zip(*(core.step(s[:, t], memory) for t in range(s.shape[1]))))

    core.eval()  # no dropout: float32 and bfloat16 compared on the same function
    with torch.no_grad():
        reference = run(*inputs)
    low = [x.to(torch.bfloat16).requires_grad_() for x in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = run(*low)
    what = f"{mechanism.tag()}, {mode} under bf16 autocast"
    assert_finite(what, **{f"output {i}": o for i, o in enumerate(outputs)})
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        error = (out.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6)
        assert error < 0.05, f"{what}: output {i} {error:.3g} of the largest away from float32's"
    backward_is_finite(what, outputs, low, core)


# -- (c) a NaN or infinite training loss stops training ----------------------------------------
def seq2seq_batch() -> dict:
    src, src_mask, tgt_in = rnn_batch()
    tgt_out = torch.roll(tgt_in, -1, 1)
    return dict(src=src, src_mask=src_mask, tgt_in=tgt_in, tgt_out=tgt_out,
                tgt_mask=torch.ones_like(tgt_in, dtype=torch.bool))


def classifier_batch() -> dict:
    tokens, mask = padded_batch()
    return dict(tokens=tokens, mask=mask, label=torch.tensor([0, 2]))


def lm_batch() -> dict:
    tokens, mask = padded_batch()
    return dict(tokens=tokens, targets=torch.roll(tokens, -1, 1), mask=mask)


def nli_batch() -> dict:
    return batch_of(PAIRS, label=torch.tensor([0, 1, 2]))


#: every LightningModule of the suite: (tiny model, one training batch)
MODELS = {
    "DecompAtt": (lambda: DecompAtt(vocab_size=10, hidden=4, dropout=0.0), nli_batch),
    "Mixture-exact": (lambda: Mixture(mode="exact", k=2, vocab_size=10, hidden=4,
                                      dropout=0.0), nli_batch),
    "Mixture-latent": (lambda: Mixture(mode="latent", k=2, vocab_size=10, hidden=4,
                                       dropout=0.0), nli_batch),  # REINFORCE
    "TransformerClassifier": (classifier, classifier_batch),
    "TransformerLM": (language_model, lm_batch),
    "TransformerSeq2Seq": (seq2seq_model, seq2seq_batch),
    "RNNSeq2Seq": (lambda: rnn_model(dtype=DT, randomise=False), seq2seq_batch),
}


def trainer(max_steps: int, callbacks=(), **kwargs) -> L.Trainer:
    return L.Trainer(max_steps=max_steps, callbacks=list(callbacks), logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
                     devices=1, **kwargs)


def loader(batch: dict, n: int) -> DataLoader:
    return DataLoader([batch] * n, batch_size=None)


class PoisonWeights(L.Callback):
    """Sets the weights to NaN before the batch of step ``at`` (the routing network of the
    latent mixture excepted: it samples a member before any loss, so the members are
    poisoned), as a diverging update would; keeps every loss handed to backward by step."""

    def __init__(self, at: int):
        self.at, self.losses = at, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.at:
            with torch.no_grad():
                for p in getattr(module, "net", module).parameters():
                    p.fill_(float("nan"))

    def on_before_backward(self, trainer, module, loss):
        self.losses[trainer.global_step] = float(loss)


def stopped(value: str, step: int, last: float) -> str:
    return (f"training loss is {value} at step {step} (last finite loss {last:.4f} at step "
            f"{step - 1}); training stopped before this step's backward pass and update")


@pytest.mark.parametrize("name", MODELS)
def test_a_nan_training_loss_stops_training_naming_the_step(name):
    make, batch = MODELS[name]
    poison = PoisonWeights(at=3)
    fit = trainer(max_steps=6, callbacks=[poison])
    with pytest.raises(NonFiniteLossError) as stop:
        fit.fit(make(), loader(batch(), 6))
    assert str(stop.value) == stopped("nan", 3, poison.losses[2])
    assert (stop.value.step, stop.value.last_finite) == (3, (2, poison.losses[2]))
    assert fit.global_step == 3  # no update from the NaN step


class PoisonRouting(L.Callback):
    """Sets the latent mixture's routing network (the inference network of q) to NaN before
    the batch of step ``at``; keeps the losses handed to backward by step."""

    def __init__(self, at: int):
        self.at, self.losses = at, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.at:
            with torch.no_grad():
                for p in module.inference.parameters():
                    p.fill_(float("nan"))

    def on_before_backward(self, trainer, module, loss):
        self.losses[trainer.global_step] = float(loss)


def test_a_nan_routing_distribution_stops_the_latent_mixture_before_sampling():
    """q is sampled before any loss exists: a NaN q stops training with the one-line
    message naming q (torch.multinomial raised "probability tensor contains either inf, nan
    or element < 0", naming nothing)."""
    poison = PoisonRouting(at=3)
    fit = trainer(max_steps=6, callbacks=[poison])
    model = Mixture(mode="latent", k=2, vocab_size=10, hidden=4, dropout=0.0)
    with pytest.raises(NonFiniteLossError) as stop:
        fit.fit(model, loader(nli_batch(), 6))
    assert str(stop.value) == stopped("nan", 3, poison.losses[2]).replace(
        "training loss", "routing distribution log q(c | y, a, b)")
    assert fit.global_step == 3


def test_a_training_step_called_without_a_trainer_checks_alone():
    """A training step called by hand (no trainer: tests, notebooks) trains on finite values
    and stops on a NaN q by itself (it asked the absent trainer's strategy and failed with
    "Mixture is not attached to a `Trainer`" on every call)."""
    model = Mixture(mode="latent", k=2, vocab_size=10, hidden=4, dropout=0.0)
    model.log = lambda *args, **kwargs: None
    assert torch.isfinite(model.training_step(nli_batch(), 0))
    with torch.no_grad():
        for p in model.inference.parameters():
            p.fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match=r"routing distribution .* is nan at step 0"):
        model.training_step(nli_batch(), 1)


def test_the_moving_average_baseline_never_takes_a_nan_reward():
    """With the "ema" baseline a NaN reward (members poisoned) stops training before the
    moving average takes it in: the baseline a resumed run starts from is still finite."""
    poison = PoisonWeights(at=3)
    fit = trainer(max_steps=6, callbacks=[poison])
    model = Mixture(mode="latent", k=2, vocab_size=10, hidden=4, dropout=0.0, baseline="ema")
    with pytest.raises(NonFiniteLossError) as stop:
        fit.fit(model, loader(nli_batch(), 6))
    assert str(stop.value) == stopped("nan", 3, poison.losses[2]).replace(
        "training loss", "reward log p(y | a, b; theta_c)")
    assert torch.isfinite(model.reward_ema).all() and int(model.reward_ema_steps) == 3


def test_an_infinite_loss_with_gradient_accumulation():
    """The message gives the loss training_step returned (Lightning hands backward the loss
    divided by accumulate_grad_batches); steps count optimiser steps."""
    model, returned = classifier(), []
    original = model.training_step

    def training_step(batch, batch_idx):
        loss = original(batch, batch_idx)
        returned.append(float(loss))
        return loss * float("inf") if batch_idx == 4 else loss  # 2 batches per step: step 2

    model.training_step = training_step
    fit = trainer(max_steps=5, accumulate_grad_batches=2)
    with pytest.raises(NonFiniteLossError, match="^training loss is inf at step 2 ") as stop:
        fit.fit(model, loader(classifier_batch(), 10))
    assert str(stop.value) == stopped("inf", 2, returned[3])


_DDP_STOP = """
import sys
import lightning as L
import torch
from torch.utils.data import DataLoader
from lit_models.base import NonFiniteLossError
from tests.attention.test_numerics import classifier_batch
from tests.lit_models.test_transformer_classifier_lm import classifier


model = classifier()
original = model.training_step


def training_step(batch, batch_idx):
    loss = original(batch, batch_idx)
    rank = model.trainer.global_rank
    return loss * float("nan") if (rank, model.trainer.global_step) == (1, 2) else loss


model.training_step = training_step
fit = L.Trainer(max_steps=5, strategy="ddp", devices=2, accelerator="cpu", logger=False,
                enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0)
try:
    fit.fit(model, DataLoader([classifier_batch()] * 10, batch_size=None))
except NonFiniteLossError as err:
    message = str(err)
else:
    message = "not stopped"
with open(f"{sys.argv[1]}/rank{fit.global_rank}.txt", "w") as out:
    out.write(f"{message}\\nsteps {fit.global_step}\\n")
"""


def test_under_ddp_both_processes_stop_on_one_processs_nan(tmp_path):
    """DDP, 2 gloo processes, a NaN loss in process 1 only: both stop at that step with the
    message (process 0: "not finite in another process"), no update; neither hangs in the
    gradient all-reduce."""
    script = tmp_path / "ddp_stop.py"
    script.write_text(_DDP_STOP)
    root = Path(__file__).parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = ((tmp_path / f"rank{r}.txt").read_text().splitlines() for r in (0, 1))
    assert rank0[0].startswith("training loss is not finite in another process at step 2 "
                               "(last finite loss ")
    assert rank1[0].startswith("training loss is nan at step 2 (last finite loss ")
    assert rank0[1] == rank1[1] == "steps 2"  # no update from step 2


def test_a_finite_run_is_unchanged_by_the_check(monkeypatch):
    """The same weights after 4 steps with and without the check."""
    def train() -> dict:
        model = classifier()
        fit = trainer(max_steps=4)
        fit.fit(model, loader(classifier_batch(), 4))
        assert fit.global_step == 4
        return {k: v.clone() for k, v in model.state_dict().items()}

    checked = train()
    monkeypatch.setattr(AttnReproModule, "on_before_backward",
                        L.LightningModule.on_before_backward)
    unchecked = train()
    for key, value in checked.items():
        assert torch.equal(value, unchecked[key]), key
