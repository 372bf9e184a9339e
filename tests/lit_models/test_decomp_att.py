"""DecompAtt (lit_models/decomp_att.py) against the write-up's equations: a tiny example
computed by hand, a naive loop-by-loop reference of Eq. 3-10, padding, the distance
buckets of intra-attention, frozen pretrained vectors, weights for plotting, checkpoints."""

from __future__ import annotations

import itertools
import math

import lightning as L
import numpy as np
import pytest
import torch

from attention import UnsupportedContext, build
from lit_models.decomp_att import DecompAtt, DecompAttNet, distance_buckets
from lit_models.plots import attention_heatmaps, figure_image
from tests.conftest import supporting


def set_mlp(mlp, w1, w2, b1=None, b2=None):
    """Set the (K=1) weights of a StackedMLP: layers 1 and 4, weights as (in, out)."""
    with torch.no_grad():
        for layer, w, b in ((mlp[1], w1, b1), (mlp[4], w2, b2)):
            layer.weight.copy_(torch.as_tensor(w, dtype=layer.weight.dtype)[None])
            layer.bias.copy_(torch.zeros_like(layer.bias) if b is None
                             else torch.as_tensor(b, dtype=layer.bias.dtype).view(1, 1, -1))


def batch_of(pairs, pad_id=0, label=None):
    """A padded batch from (premise ids, hypothesis ids) lists."""
    la, lb = max(len(p) for p, _ in pairs), max(len(h) for _, h in pairs)
    out = {"premise": torch.full((len(pairs), la), pad_id),
           "hypothesis": torch.full((len(pairs), lb), pad_id),
           "premise_mask": torch.zeros(len(pairs), la, dtype=torch.bool),
           "hypothesis_mask": torch.zeros(len(pairs), lb, dtype=torch.bool),
           "label": torch.zeros(len(pairs), dtype=torch.long) if label is None else label}
    for i, (p, h) in enumerate(pairs):
        out["premise"][i, :len(p)], out["premise_mask"][i, :len(p)] = torch.tensor(p), True
        out["hypothesis"][i, :len(h)], out["hypothesis_mask"][i, :len(h)] = torch.tensor(h), True
    return out


# -- a tiny example by hand ---------------------------------------------------------------------
def hand_model(attention: str = "softmax", **settings) -> DecompAtt:
    """hidden 2; words 1 = [1,0], 2 = [0,1], 3 = [1,1]; F = identity; G sums a_i and beta_i;
    H's first layer sums v1 and v2; the output layer gives [h1, h2, h1 - h2].  CoDA: F_E =
    F_N = Parikh's F (``coda_features="mlp"``) and N the plain L1 norm unless ``settings``
    say otherwise."""
    if attention == "coda":
        settings = {"coda_features": "mlp", "coda_distance": "sum", **settings}
    model = DecompAtt(vocab_size=4, hidden=2, dropout=0.0, attention=build(attention),
                      **settings).double().eval()
    net = model.net
    with torch.no_grad():
        net.embed.weight.copy_(torch.tensor([[[0, 0], [1, 0], [0, 1], [1, 1]]]))
    eye, pair_sum = np.eye(2), np.vstack([np.eye(2), np.eye(2)])
    if settings.get("coda_features") == "linear":
        with torch.no_grad():
            net.attend[1].weight.copy_(torch.tensor([[[1.0, 0.0], [-1.0, 1.0]]]))
    else:
        set_mlp(net.attend, eye, eye)  # F(x) = relu(relu(x)) = x for x >= 0
    set_mlp(net.compare, pair_sum, eye)  # G([x; y]) = x + y
    set_mlp(net.aggregate, pair_sum, eye)  # H: v1 + v2
    with torch.no_grad():
        net.classify.weight.copy_(torch.tensor([[[1, 0, 1], [0, 1, -1]]]))
        net.classify.bias.zero_()
    return model


def test_hand_computed_tiny_example():
    # premise a = (w1, w2) = ([1,0], [0,1]), hypothesis b = (w1) = ([1,0])
    # e_11 = 1, e_21 = 0; one hypothesis word: beta_1 = beta_2 = b_1 = [1,0]
    # alpha_1 = softmax_i(1, 0) . a = [s, 1-s] with s = sigmoid(1)
    # v1 = G([a_1; beta_1]) + G([a_2; beta_2]) = [2,0] + [1,1] = [3,1];  v2 = [1+s, 1-s]
    # H: [3 + 1 + s, 1 + 1 - s] = [4+s, 2-s] -> logits [4+s, 2-s, 2+2s]
    s = 1 / (1 + math.exp(-1))
    expected = torch.tensor([4 + s, 2 - s, 2 + 2 * s], dtype=torch.float64)
    model = hand_model()
    out = model(batch_of([([1, 2], [1])]), need_weights=True)
    assert torch.allclose(out.logits[0, 0], expected, atol=1e-12)
    # the alignment weights: weight of b_1 for each a_i is 1; weights of a_i for b_1: (s, 1-s)
    assert torch.allclose(out.weights_a[0, 0], torch.ones(2, 1, dtype=torch.float64))
    assert torch.allclose(out.weights_b[0, 0, :, 0], torch.tensor([s, 1 - s],
                                                                   dtype=torch.float64))
    # the same pair padded inside a batch with a longer one: the same logits
    padded = model(batch_of([([3, 3, 3, 1], [2, 2, 1]), ([1, 2], [1])]))
    assert torch.allclose(padded.logits[0, 1], expected, atol=1e-12)


# -- the naive reference: Eq. 3-10 with loops ----------------------------------------------------
def np_mlp(mlp, x):
    w1, b1 = mlp[1].weight[0].numpy(), mlp[1].bias[0, 0].numpy()
    w2, b2 = mlp[4].weight[0].numpy(), mlp[4].bias[0, 0].numpy()
    return np.maximum(np.maximum(x @ w1 + b1, 0) @ w2 + b2, 0)


def softmax_np(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def naive_decomp_att(net: DecompAttNet, premise: list[int], hypothesis: list[int]):
    """Logits (C,) of one unpadded pair, every sum a Python loop."""
    with torch.no_grad():
        if net.vectors is not None:
            table = net.vectors.numpy() @ net.project.weight[0].numpy()
        else:
            table = net.embed.weight[0].numpy()

        def encode(ids):
            x = table[ids]  # (L,H)
            if net.intra is None:
                return x
            f = np_mlp(net.intra.f_intra, x)
            d = net.intra.distance_bias[0].numpy()
            out = []
            for i in range(len(ids)):
                scores = np.array([f[i] @ f[j] + d[min(abs(i - j), net.intra.max_distance + 1)]
                                   for j in range(len(ids))])  # Eq. 9 + d_{i-j}
                w = softmax_np(scores)
                out.append(sum(w[j] * x[j] for j in range(len(ids))))  # Eq. 10
            return np.concatenate([x, np.array(out)], axis=1)

        a, b = encode(premise), encode(hypothesis)
        fa, fb = np_mlp(net.attend, a), np_mlp(net.attend, b)
        e = np.array([[fa[i] @ fb[j] for j in range(len(b))] for i in range(len(a))])  # Eq. 3
        beta = [sum(softmax_np(e[i])[j] * b[j] for j in range(len(b))) for i in range(len(a))]
        alpha = [sum(softmax_np(e[:, j])[i] * a[i] for i in range(len(a)))
                 for j in range(len(b))]  # Eq. 4
        v1 = sum(np_mlp(net.compare, np.concatenate([a[i], beta[i]])) for i in range(len(a)))
        v2 = sum(np_mlp(net.compare, np.concatenate([b[j], alpha[j]])) for j in range(len(b)))
        h = np_mlp(net.aggregate, np.concatenate([v1, v2]))
        return h @ net.classify.weight[0].numpy() + net.classify.bias[0, 0].numpy()  # Eq. 7


PAIRS = [([5, 7, 2, 9, 3, 8, 4, 6, 2, 5, 7, 3, 9, 8], [3, 4, 5]), ([2, 3], [4, 5, 6, 7, 8]),
         ([9], [9])]


@pytest.mark.parametrize("intra", [False, True])
@pytest.mark.parametrize("pretrained", [False, True])
def test_matches_the_naive_equations(intra, pretrained):
    torch.manual_seed(0)
    vectors = torch.randn(10, 5) if pretrained else None
    model = DecompAtt(vocab_size=10, hidden=6, dropout=0.0, intra=intra,
                      embeddings=vectors).double().eval()
    with torch.no_grad():  # distinct distance biases so that a wrong bucket shows
        if intra:
            model.net.intra.distance_bias.copy_(torch.linspace(-1, 1, 12)[None])
        for p in model.parameters():  # larger weights: sharper, less uniform softmaxes
            p.mul_(2)
    logits = model(batch_of(PAIRS)).logits[0]  # (B,C)
    for i, (p, h) in enumerate(PAIRS):
        expected = naive_decomp_att(model.net, p, h)
        np.testing.assert_allclose(logits[i].detach().numpy(), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mechanism", supporting("alignment"))
def test_padding_does_not_change_the_outputs(mechanism):
    torch.manual_seed(1)
    model = DecompAtt(vocab_size=10, hidden=6, dropout=0.0, intra=True,
                      attention=build(mechanism)).double().eval()
    batch = batch_of(PAIRS)
    together = model(batch, need_weights=True)
    for i, pair in enumerate(PAIRS):
        alone = model(batch_of([pair]), need_weights=True)
        assert torch.allclose(together.logits[0, i], alone.logits[0, 0], atol=1e-10)
        la, lb = len(pair[0]), len(pair[1])
        assert torch.allclose(together.weights_a[0, i, :la, :lb], alone.weights_a[0, 0],
                              atol=1e-10)
        # padded rows and columns get exactly zero weight
        assert (together.weights_a[0, i, la:] == 0).all()
        assert (together.weights_a[0, i, :, lb:] == 0).all()
        assert (together.weights_b[0, i, la:] == 0).all()
    # pad ids under the mask do not matter either
    other = {**batch, "premise": batch["premise"].masked_fill(~batch["premise_mask"], 7)}
    assert torch.allclose(model(other).logits, together.logits, atol=1e-10)


def test_softmax_alignment_weights_are_distributions():
    torch.manual_seed(2)
    model = DecompAtt(vocab_size=10, hidden=6, dropout=0.0).eval()
    out = model(batch_of(PAIRS), need_weights=True)
    for i, (p, h) in enumerate(PAIRS):
        wa, wb = out.weights_a[0, i, :len(p), :len(h)], out.weights_b[0, i, :len(p), :len(h)]
        assert torch.allclose(wa.sum(1), torch.ones(len(p)))  # beta_i: over b_j
        assert torch.allclose(wb.sum(0), torch.ones(len(h)))  # alpha_j: over a_i


def test_distance_buckets_share_one_bias_beyond_ten():
    buckets = distance_buckets(15)
    assert buckets[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 11, 11, 11]
    assert buckets[14, 3] == 11 and buckets[3, 14] == 11 and buckets[7, 2] == 5
    # through the module: F_intra = 0, so a'_i = sum_j softmax_j(d_{|i-j|}) a_j
    model = DecompAtt(vocab_size=20, hidden=3, dropout=0.0, intra=True).double().eval()
    intra = model.net.intra
    d = torch.arange(12, dtype=torch.float64) / 4  # bucket 11 (> 10) largest
    with torch.no_grad():
        intra.f_intra[4].weight.zero_()
        intra.f_intra[4].bias.zero_()
        intra.distance_bias.copy_(d[None])
    x = torch.randn(1, 1, 15, 3, dtype=torch.float64)
    out = intra(x, torch.ones(1, 1, 15, dtype=torch.bool))[0, 0]
    for i in (0, 7, 14):
        w = torch.softmax(torch.tensor([d[min(abs(i - j), 11)] for j in range(15)]), 0)
        assert torch.allclose(out[i], (w[:, None] * x[0, 0]).sum(0), atol=1e-12)
    # distances 11 and 14 from position 0 weigh the same, distance 10 less
    w0 = torch.softmax(torch.tensor([d[min(j, 11)] for j in range(15)]), 0)
    assert w0[11] == w0[14] > w0[10]


def test_pretrained_vectors_are_frozen_and_projected_without_bias():
    torch.manual_seed(3)
    vectors = torch.randn(10, 5)
    model = DecompAtt(vocab_size=10, hidden=4, embeddings=vectors)
    assert model.net.embed is None and model.net.project.bias is None
    assert model.net.project.weight.shape == (1, 5, 4)
    assert "net.vectors" not in dict(model.named_parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = model.net.project.weight.detach().clone()
    model(batch_of(PAIRS)).logits.sum().backward()
    opt.step()
    assert torch.equal(model.net.vectors, vectors)  # frozen
    assert not torch.equal(model.net.project.weight, before)  # the projection learns
    # without vectors: a trained embedding of size hidden, padding row zero
    trained = DecompAtt(vocab_size=10, hidden=4, pad_id=1)
    assert trained.net.vectors is None and trained.net.embed.weight.shape == (1, 10, 4)
    assert (trained.net.embed.weight[0, 1] == 0).all()


def test_checkpoint_with_pretrained_vectors_loads(tmp_path):
    torch.manual_seed(4)
    model = DecompAtt(vocab_size=10, hidden=4, embeddings=torch.randn(10, 5), dropout=0.0)
    batch = batch_of(PAIRS, label=torch.tensor([0, 1, 2]))
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, torch.utils.data.DataLoader([batch], batch_size=None))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    loaded = DecompAtt.load_from_checkpoint(tmp_path / "m.ckpt", weights_only=False).eval()
    assert loaded.hparams.pretrained_dim == 5
    assert torch.equal(loaded.net.vectors, model.net.vectors)
    assert torch.allclose(loaded(batch).logits, model.eval()(batch).logits)


def test_unsupported_mechanism_fails_at_construction():
    with pytest.raises(UnsupportedContext, match="cannot be used for alignment"):
        DecompAtt(vocab_size=10, attention=build("relative"))


def test_bad_inputs_are_clear_errors():
    model = DecompAtt(vocab_size=10, hidden=4)
    batch = batch_of(PAIRS)
    with pytest.raises(TypeError, match="premise_mask must be boolean"):
        model({**batch, "premise_mask": batch["premise_mask"].long()})
    with pytest.raises(ValueError, match="same shape"):
        model({**batch, "premise": batch["premise"][:, :2]})
    with pytest.raises(ValueError, match=r"vocab_size=10, dim\)"):
        DecompAtt(vocab_size=10, embeddings=torch.randn(9, 5))
    with pytest.raises(ValueError, match="dropout"):
        DecompAtt(vocab_size=10, dropout=1.0)


def test_heat_map_figure():
    wa = torch.softmax(torch.randn(3, 2), 1)
    wb = torch.softmax(torch.randn(3, 2), 0)
    fig = attention_heatmaps(["a", "dog", "runs"], ["dog", "moves"], wa, wb, title="t")
    assert [ax.get_title() for ax in fig.axes[::2]][0].startswith("log weights")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["a", "dog", "runs"]
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), np.log(wa.numpy()),
                               rtol=1e-6)
    image = figure_image(fig)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    signed = attention_heatmaps(["a", "b", "c"], ["d", "e"], wa - 0.5, wa - 0.5)
    assert signed.axes[0].get_title() == "quasi-attention M"
    with pytest.raises(ValueError, match=r"must be \(3, 2\)"):
        attention_heatmaps(["a", "b", "c"], ["d", "e"], wa.T, wb)


def test_coda_figure_2_factors_by_hand():
    """F = identity: premise [1, 3] = [[1,0],[1,1]], hypothesis [2] = [[0,1]] (and a padded
    second pair).  E = a.b = [0, 1], N = -|a - b|_1 = [-2, -1] (no 1/sqrt(d) in alignment)."""
    model = hand_model("coda")
    batch = batch_of([([1, 3], [2]), ([2], [2, 1])])
    got = model.alignment_factors(batch)
    assert set(got) == {"tanh(E)", "sigmoid(N)", "M"}
    # valid pairs only, pair 1 then pair 2: (a1,b1), (a2,b1); then (a1,b1), (a1,b2)
    e = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64)  # pair 2: [0,1].[0,1], [0,1].[1,0]
    n = torch.tensor([-2.0, -1.0, 0.0, -2.0], dtype=torch.float64)
    torch.testing.assert_close(got["tanh(E)"], torch.tanh(e))
    torch.testing.assert_close(got["sigmoid(N)"], torch.sigmoid(n))
    torch.testing.assert_close(got["M"], torch.tanh(e) * torch.sigmoid(n))
    weights = model(batch, need_weights=True).weights_a[0]  # M itself: the same values
    valid = batch["premise_mask"][:, :, None] & batch["hypothesis_mask"][:, None, :]
    torch.testing.assert_close(weights[valid], got["M"])
    assert hand_model("softmax").alignment_factors(batch) is None


def test_coda_linear_features_can_subtract_by_hand():
    """coda_features="linear": F_E = F_N = x W with W = [[1, 0], [-1, 1]] (no ReLU), so
    F(w1) = [1,0], F(w2) = [-1,1], F(w3) = [0,1]; coda_distance="mean": N = -|.|_1 / 2."""
    model = hand_model("coda", coda_features="linear", coda_distance="mean")
    batch = batch_of([([1, 3], [2]), ([2], [2, 1])])
    got = model.alignment_factors(batch)
    e = torch.tensor([-1.0, 1.0, 2.0, -1.0], dtype=torch.float64)  # E < 0: tanh(E) subtracts
    n = torch.tensor([-1.5, -0.5, 0.0, -1.5], dtype=torch.float64)
    torch.testing.assert_close(got["tanh(E)"], torch.tanh(e))
    torch.testing.assert_close(got["sigmoid(N)"], torch.sigmoid(n))
    torch.testing.assert_close(got["M"], torch.tanh(e) * torch.sigmoid(n))
    # beta still scales: N = -beta * |.|_1 / hidden
    model = hand_model("coda", coda_features="linear", coda_distance="mean")
    model.net.align[0].options["beta"] *= 4
    torch.testing.assert_close(model.alignment_factors(batch)["sigmoid(N)"],
                               torch.sigmoid(4 * n))
    assert model.mechanisms["alignment"].beta == 1.0  # the flag as the user set it


def test_coda_alignment_is_signed_and_gated_at_initialisation_on_snli(shared):
    """The paper's d = 200 on real SNLI pairs: at initialisation tanh(E) takes both signs
    and the mean gate sigmoid(N) is in [0.05, 0.95]; the old setting (Parikh's ReLU F, the
    plain L1 norm) gives tanh(E) >= 0 and closed gates, which this test would catch."""
    from datamodules.common import Vocab
    from datamodules.nli import read_nli_jsonl

    path = shared("snli/snli_1.0_dev.first1288.jsonl")
    examples = list(itertools.islice(read_nli_jsonl(path), 300))
    vocab = Vocab.build(ex.premise + ex.hypothesis for ex in examples)
    batch = batch_of([(vocab.encode(ex.premise), vocab.encode(ex.hypothesis))
                      for ex in examples], pad_id=vocab.pad_id)

    def factors(**settings):
        torch.manual_seed(0)
        model = DecompAtt(vocab_size=len(vocab), pad_id=vocab.pad_id, hidden=200,
                          attention=build("coda"), **settings).eval()
        return model.alignment_factors(batch)

    new = factors()
    negative = (new["tanh(E)"] < 0).float().mean().item()
    assert 0.2 < negative < 0.8
    assert 0.05 <= new["sigmoid(N)"].mean().item() <= 0.95
    old = factors(coda_features="mlp", coda_distance="sum")
    assert (old["tanh(E)"] >= 0).all()
    assert old["sigmoid(N)"].mean().item() < 0.05
