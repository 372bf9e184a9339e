"""TransformerClassifier and TransformerLM: shapes, pooling, padding invisible to the
classifier, causality of the LM for every mechanism, attention_layers, and the metrics
(accuracy and token-weighted perplexity) as Lightning logs them over several batches."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import attention
from attention import REGISTRY, build
from attention.masking import masked_max
from lit_models.metrics import Perplexity
from lit_models.transformer import TransformerClassifier, TransformerLM

MULTIHEAD = [n for n, cls in REGISTRY.items() if cls().supports("multihead")]
V, PAD = 17, 0


def classifier(**kwargs):
    torch.manual_seed(0)
    options = dict(pad_id=PAD, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0,
                   attention_dropout=0.0)
    return TransformerClassifier(V, 3, **{**options, **kwargs}).eval()


def language_model(**kwargs):
    torch.manual_seed(0)
    options = dict(pad_id=PAD, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0,
                   attention_dropout=0.0)
    return TransformerLM(V, **{**options, **kwargs}).eval()


def padded_batch():
    """Two sequences of lengths 6 and 4 (right-padded with PAD)."""
    torch.manual_seed(1)
    tokens = torch.randint(4, V, (2, 6))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    return tokens.masked_fill(~mask, PAD), mask


def quiet_trainer():
    return L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False)


# ---------------------------------------------------------------------------------------
# shapes and structure


def test_classifier_and_lm_shapes_and_weights():
    tokens, mask = padded_batch()
    c = classifier(attention=build("coda"))
    with torch.no_grad():
        logits, weights = c(tokens, mask, need_weights=True)
    assert logits.shape == (2, 3)
    assert len(weights["encoder"]) == 2 and weights["encoder"][0].shape == (2, 2, 6, 6)
    lm = language_model()
    with torch.no_grad():
        logits, weights = lm(tokens, mask, need_weights=True)
    assert logits.shape == (2, 6, V)
    w = weights["decoder"][0]
    assert w.shape == (2, 2, 6, 6)
    assert torch.all(w.triu(1) == 0)  # no weight on future keys
    assert torch.all(w[1, :, :, 4:] == 0)  # none on padded keys


@pytest.mark.parametrize("make,module", [(classifier, "encoder"), (language_model, "decoder")])
def test_attention_layers_puts_the_mechanism_in_the_lowest_layers_only(make, module):
    m = make(attention=build("window", variant="mw"), n_layers=3, attention_layers=2)
    names = [layer.self_attn.mechanism.name for layer in getattr(m, module).layers]
    assert names == ["window", "window", "softmax"]
    assert m.mechanisms[module].tag() == "window(variant=mw)"
    everywhere = make(attention=build("coda"), n_layers=3)  # None: every layer
    assert [layer.self_attn.mechanism.name for layer in getattr(everywhere, module).layers] \
        == ["coda"] * 3
    with pytest.raises(ValueError, match=r"attention_layers must be in \[0, 3\], got 4"):
        make(n_layers=3, attention_layers=4)


def test_lm_has_no_cross_attention_and_ties_the_output_to_the_embedding():
    lm = language_model()
    assert all(layer.cross_attn is None for layer in lm.decoder.layers)
    assert lm.decoder.out.weight is lm.decoder.embed.tokens.weight
    untied = language_model(tie_output=False)
    assert untied.n_parameters() == lm.n_parameters() + V * 16


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="pooling must be 'mean', 'max' or 'first', got 'sum'"):
        classifier(pooling="sum")
    with pytest.raises(ValueError, match="num_classes must be at least 2, got 1"):
        TransformerClassifier(V, 1)


# ---------------------------------------------------------------------------------------
# pooling and padding


@pytest.mark.parametrize("pooling", ["mean", "max", "first"])
def test_pooling_of_the_real_tokens(pooling):
    c = classifier(pooling=pooling)
    tokens, mask = padded_batch()
    with torch.no_grad():
        h, _ = c.encoder(tokens, mask)
        logits = c(tokens, mask).logits
    real = h[1, :4]  # the second sequence's real states
    expected = {"mean": real.mean(0), "max": real.max(0).values, "first": real[0]}[pooling]
    assert torch.allclose(logits[1], c.classifier(expected), atol=1e-6)


def test_masked_max_ignores_masked_entries_and_gives_zero_for_an_empty_slice():
    x = torch.tensor([[[1.0, -5.0], [7.0, -1.0], [9.0, 9.0]],
                      [[-3.0, -4.0], [8.0, 8.0], [8.0, 8.0]]])  # (B=2, L=3, D=2)
    mask = torch.tensor([[True, True, False], [False, False, False]])[..., None]
    assert torch.equal(masked_max(x, mask, dim=1), torch.tensor([[7.0, -1.0], [0.0, 0.0]]))


@pytest.mark.parametrize("name", MULTIHEAD)
@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_padding_does_not_change_the_classifier_output(name, pooling):
    c = classifier(attention=build(name), pooling=pooling)
    tokens, mask = padded_batch()
    other = tokens.clone()
    other[1, 4:] = torch.tensor([5, 6])  # different ids at the padded positions
    with torch.no_grad():
        a = c(tokens, mask).logits
        b = c(other, mask).logits
        alone = c(tokens[1:, :4], mask[1:, :4]).logits  # the short sequence without any padding
    assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(a[1], alone[0], atol=1e-5)


# ---------------------------------------------------------------------------------------
# causality of the language model


@pytest.mark.parametrize("name", MULTIHEAD)
def test_lm_is_causal_for_every_mechanism(name):
    try:  # an option with no causal form is refused when the model is built
        lm = language_model(attention=build(name))
    except attention.UnsupportedContext as err:
        assert "causal" in str(err) and name in str(err)
        pytest.skip(str(err))
    torch.manual_seed(2)
    tokens = torch.randint(4, V, (2, 7))
    changed = tokens.clone()
    changed[:, 4:] = torch.randint(4, V, (2, 3))
    with torch.no_grad():
        a = lm(tokens).logits
        b = lm(changed).logits
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-5)
    assert not torch.allclose(a[:, 4:], b[:, 4:], atol=1e-5)


# ---------------------------------------------------------------------------------------
# metrics as logged over several batches


def lm_batches():
    """Two batches of different lengths and different numbers of real target tokens."""
    torch.manual_seed(3)
    out = []
    for lengths in ([5, 2, 3], [9]):
        mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
        tokens = torch.randint(4, V, mask.shape).masked_fill(~mask, PAD)
        targets = torch.randint(4, V, mask.shape).masked_fill(~mask, PAD)
        out.append({"tokens": tokens, "targets": targets, "mask": mask})
    return out


def test_perplexity_is_token_weighted_over_batches():
    lm = language_model()
    batches = lm_batches()
    total, count, per_batch = 0.0, 0, []
    with torch.no_grad():
        for batch in batches:  # -log p(target) by hand, position by position
            logp = lm(batch["tokens"], batch["mask"]).logits.double().log_softmax(-1)
            nll = [-logp[b, t, batch["targets"][b, t]].item()
                   for b, t in batch["mask"].nonzero().tolist()]
            total, count = total + sum(nll), count + len(nll)
            per_batch.append(math.exp(sum(nll) / len(nll)))
    expected = math.exp(total / count)
    # the data makes the wrong reductions differ from the right one
    assert abs(expected - sum(per_batch) / 2) > 1e-3 * expected
    logged = quiet_trainer().validate(lm, DataLoader(batches, batch_size=None),
                                      verbose=False)[0]
    assert logged["val/perplexity"] == pytest.approx(expected, rel=1e-5)
    assert logged["val/loss"] == pytest.approx(total / count, rel=1e-5)


def test_perplexity_metric_state_and_errors():
    metric = Perplexity()
    metric.update(torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[True, True, False]]))
    metric.update(torch.tensor([[3.0]]), torch.tensor([[True]]))
    assert metric.compute().item() == pytest.approx(math.exp(6.0 / 3))
    with pytest.raises(ValueError, match="boolean mask of one shape"):
        metric.update(torch.zeros(2, 3), torch.ones(2, 3))


def test_classifier_accuracy_counts_every_example_of_the_split():
    c = classifier()
    tokens, mask = padded_batch()
    with torch.no_grad():
        pred = c(tokens, mask).logits.argmax(-1)
    # batch 1: both right; batch 2: three copies, one right -> 3/5, not the mean 2/3 of batches
    wrong = (pred + 1) % 3
    batches = [{"tokens": tokens, "mask": mask, "label": pred},
               {"tokens": tokens[[0, 0, 1]], "mask": mask[[0, 0, 1]],
                "label": torch.stack([pred[0], wrong[0], wrong[1]])}]
    logged = quiet_trainer().test(c, DataLoader(batches, batch_size=None), verbose=False)[0]
    assert logged["test/acc"] == pytest.approx(3 / 5)
    with torch.no_grad():
        losses = [F.cross_entropy(c(b["tokens"], b["mask"]).logits, b["label"], reduction="sum")
                  for b in batches]
    assert logged["test/loss"] == pytest.approx(float(sum(losses)) / 5, rel=1e-5)
