"""The ensembles of lit_models/mixture.py: the exact ensemble's formula against a loop over
separate models, the batched members, the grouping by sampled member, and the REINFORCE
estimator's sign on problems where one member is clearly better."""

from __future__ import annotations

import math
import statistics
import time

import pytest
import torch
import torch.nn.functional as F

from attention import build
from lit_models.decomp_att import DecompAtt, ensemble_log_probs
from lit_models.mixture import Mixture, group_by_member, kl_to_uniform, latent_objective
from tests.lit_models.test_decomp_att import PAIRS, batch_of

LABELS = torch.tensor([0, 2, 1])


def separate_models(k: int, **kwargs) -> list[DecompAtt]:
    models = []
    for seed in range(k):
        torch.manual_seed(100 + seed)
        models.append(DecompAtt(**kwargs).double().eval())
    return models


@pytest.mark.parametrize("settings", [dict(), dict(intra=True), dict(attention=build("additive")),
                                      dict(embeddings=torch.randn(10, 5))],
                         ids=["softmax", "intra", "additive-per-member", "pretrained"])
def test_stacked_members_equal_a_loop_over_separate_models(settings):
    kwargs = dict(vocab_size=10, hidden=6, dropout=0.0, **settings)
    models = separate_models(3, **kwargs)
    mixture = Mixture(k=3, **kwargs).double().eval()
    mixture.net.load_members([m.net for m in models])
    batch = batch_of(PAIRS, label=LABELS)
    out = mixture(batch, need_weights=True)
    for c, model in enumerate(models):  # the one batched call = each model on its own
        alone = model(batch, need_weights=True)
        assert torch.allclose(out.logits[c], alone.logits[0], atol=1e-12)
        assert torch.allclose(out.weights_a[c], alone.weights_a[0], atol=1e-12)
    # test-time enumeration: log of the mean of the members' probabilities, by a loop
    mean_p = sum(F.softmax(m(batch).logits[0], -1) for m in models) / 3
    assert torch.allclose(mixture.log_probs(batch), mean_p.log(), atol=1e-12)
    # and the members differ (else the check above would be weak)
    assert not torch.allclose(out.logits[0], out.logits[1])


@pytest.mark.parametrize("mode", ["exact", "latent"])
def test_ensemble_probabilities_sum_to_one(mode):
    torch.manual_seed(5)
    mixture = Mixture(mode=mode, k=4, vocab_size=10, hidden=6).double().eval()
    batch = batch_of(PAIRS, label=LABELS)
    p = mixture.log_probs(batch).exp()  # (B,C)
    assert p.shape == (3, 3) and torch.allclose(p.sum(-1), torch.ones(3, dtype=p.dtype))
    member = mixture.member_log_probs(batch).exp()  # (K,B,C)
    assert torch.allclose(member.sum(-1), torch.ones(4, 3, dtype=p.dtype))
    assert torch.allclose(p, member.mean(0))


def test_exact_training_loss_is_the_marginal_likelihood():
    torch.manual_seed(6)
    mixture = Mixture(mode="exact", k=3, vocab_size=10, hidden=6, dropout=0.0).double()
    mixture.log = lambda *args, **kwargs: None  # no trainer here
    batch = batch_of(PAIRS, label=LABELS)
    loss = mixture.training_step(batch, 0)
    p = mixture.member_log_probs(batch).exp()  # (K,B,C)
    marginal = torch.stack([p[:, i, y].mean() for i, y in enumerate(LABELS.tolist())])
    assert torch.allclose(loss, -marginal.log().mean(), atol=1e-12)
    assert torch.allclose(ensemble_log_probs(torch.log(p)).exp(), p.mean(0))


def test_group_by_member():
    sample = torch.tensor([2, 0, 2, 2, 1, 0, 2])
    slots, valid = group_by_member(sample, 4)
    assert slots.shape == (4, 4) and valid.sum() == 7
    assert slots[2][valid[2]].tolist() == [0, 2, 3, 6]
    assert slots[0][valid[0]].tolist() == [1, 5] and slots[1][valid[1]].tolist() == [4]
    assert not valid[3].any()
    # each example exactly once, in its member's row
    for c in range(4):
        assert (sample[slots[c][valid[c]]] == c).all()


def test_sampled_members_equal_the_enumeration():
    torch.manual_seed(7)
    mixture = Mixture(mode="latent", k=3, vocab_size=10, hidden=6, dropout=0.0).double()
    batch = batch_of(PAIRS * 3, label=LABELS.repeat(3))
    sample = torch.tensor([0, 2, 2, 1, 0, 2, 2, 2, 0])
    log_p, correct = mixture.sampled_log_likelihood(batch, sample)
    every = mixture.member_log_probs(batch)  # (K,B,C)
    y = batch["label"]
    expected = every[sample, torch.arange(9), y]
    assert torch.allclose(log_p, expected, atol=1e-12)
    assert torch.equal(correct, every[sample, torch.arange(9)].argmax(-1) == y)
    # the gradient of member c comes only from its own examples
    log_p[sample == 1].sum().backward()
    grads = mixture.net.classify.weight.grad
    assert grads[1].abs().sum() > 0 and grads[0].abs().sum() == 0 and grads[2].abs().sum() == 0


def posterior(log_p: torch.Tensor) -> torch.Tensor:
    """The q maximising E_q[log p_c] - KL(q || U): q_c proportional to p_c."""
    return torch.softmax(log_p, 0)


def test_reinforce_sign_on_a_bandit():
    """Members with fixed likelihoods p(y|c) = (0.9, 0.3, 0.05): q trained by REINFORCE
    alone (+ the analytic KL) moves to the posterior p(c|y) and the ELBO rises; the
    write-up's Listing 3 sign moves q away from the good member."""
    log_p_members = torch.tensor([0.9, 0.3, 0.05]).log()
    target = posterior(log_p_members)

    def train(sign: float, baseline: str):
        torch.manual_seed(0)
        logits = torch.zeros(3, requires_grad=True)
        opt = torch.optim.Adam([logits], lr=0.05)
        for _ in range(400):
            log_q = F.log_softmax(logits, 0).expand(64, 3)  # (B,K)
            sample = torch.multinomial(log_q.exp().detach(), 1).squeeze(-1)
            log_p = log_p_members[sample]
            b = 0.0 if baseline == "none" else (log_p.sum() - log_p) / 63
            terms = latent_objective(log_q, sample, log_p, b)
            loss = -(sign * terms.surrogate - terms.kl).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        q = F.softmax(logits.detach(), 0)
        return q, (q * log_p_members).sum() - kl_to_uniform(q.log())

    start = log_p_members.mean()  # ELBO of the uniform q
    for baseline in ("none", "mean"):
        q, elbo = train(1.0, baseline)
        assert torch.allclose(q, target, atol=0.06), (baseline, q, target)
        assert elbo > start + 0.5
        assert torch.isclose(elbo, torch.logsumexp(log_p_members, 0) - math.log(3), atol=0.02)
    q_wrong, elbo_wrong = train(-1.0, "none")  # Listing 3 minimises log q(c) * log p
    assert q_wrong[0] < 0.2 and elbo_wrong < start


def test_latent_mixture_routes_to_the_better_member():
    """A whole Mixture: frozen members, one perfect (p(y) ~ 1) and two uniform; training only
    q through training_step moves q to the posterior (0.6, 0.2, 0.2) and the exact ELBO
    rises to log p(y) = log(5/9)."""
    torch.manual_seed(8)
    mixture = Mixture(mode="latent", k=3, vocab_size=10, hidden=6, dropout=0.0)
    mixture.log = lambda *args, **kwargs: None
    with torch.no_grad():  # members ignore their input: fixed logits
        mixture.net.classify.weight.zero_()
        mixture.net.classify.bias.copy_(torch.tensor([[[20.0, 0, 0]], [[0, 0, 0]], [[0, 0, 0]]]))
    for p in mixture.net.parameters():
        p.requires_grad_(False)
    batch = batch_of(PAIRS * 10, label=torch.zeros(30, dtype=torch.long))
    opt = torch.optim.Adam(mixture.inference.parameters(), lr=0.05)
    start = mixture.exact_elbo(batch)[0].mean().item()
    for step in range(80):
        loss = mixture.training_step(batch, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    elbo, _, log_q = mixture.exact_elbo(batch)
    q = log_q.exp().mean(0).detach()
    assert torch.allclose(q, torch.tensor([0.6, 0.2, 0.2]), atol=0.05), q
    assert elbo.mean() > start + 0.1
    assert abs(elbo.mean().item() - math.log(5 / 9)) < 0.01


def test_baselines():
    kwargs = dict(mode="latent", k=2, vocab_size=10, hidden=4)
    reward = torch.tensor([-1.0, -2.0, -3.0])
    mean = Mixture(baseline="mean", **kwargs)
    assert torch.allclose(mean.reward_baseline(reward), torch.tensor([-2.5, -2.0, -1.5]))
    assert Mixture(baseline="none", **kwargs).reward_baseline(reward) == 0.0
    ema = Mixture(baseline="ema", ema_decay=0.5, **kwargs)
    assert ema.reward_baseline(reward) == 0.0  # no history yet
    # after one batch of mean reward -2: average .5 * -2 = -1, bias-corrected -1 / .5 = -2
    assert torch.isclose(ema.reward_baseline(reward - 2), torch.tensor(-2.0))
    # then a batch of mean -4: .5 * -1 + .5 * -4 = -2.5, bias-corrected -2.5 / (1 - .5^2)
    assert torch.isclose(ema.reward_baseline(reward), torch.tensor(-2.5 / 0.75))


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="mode must be one of"):
        Mixture(mode="vae", vocab_size=10)
    with pytest.raises(ValueError, match="baseline must be one of"):
        Mixture(baseline="median", vocab_size=10)
    with pytest.raises(ValueError, match="k must be a positive"):
        Mixture(k=0, vocab_size=10)
    with pytest.raises(RuntimeError, match="no inference network"):
        Mixture(k=2, vocab_size=10).routing_log_probs(batch_of(PAIRS))


def test_step_times_vanilla_exact_latent():
    """Per training step (forward, backward, Adam) at the papers' size: hidden 200, batch
    32, SNLI-like lengths (premise 14, hypothesis 8), frozen 300-d vectors, one thread (the
    machine's other load disturbs two); median of interleaved steps.  Printed, not asserted
    (run with -s to see them)."""
    torch.manual_seed(9)
    vocab = 5000
    vectors = torch.randn(vocab, 300)
    batch = {"premise": torch.randint(2, vocab, (32, 14)),
             "premise_mask": torch.ones(32, 14, dtype=torch.bool),
             "hypothesis": torch.randint(2, vocab, (32, 8)),
             "hypothesis_mask": torch.ones(32, 8, dtype=torch.bool),
             "label": torch.randint(0, 3, (32,))}
    models = {"vanilla": DecompAtt(vocab_size=vocab, embeddings=vectors),
              "exact K=3": Mixture(mode="exact", k=3, vocab_size=vocab, embeddings=vectors),
              "latent K=4": Mixture(mode="latent", k=4, vocab_size=vocab, embeddings=vectors),
              "exact K=4": Mixture(mode="exact", k=4, vocab_size=vocab, embeddings=vectors)}
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-3) for name, m in models.items()}
    times = {name: [] for name in models}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in range(7):  # 2 warm-up steps
            for name, model in models.items():
                model.log = lambda *args, **kwargs: None
                start = time.perf_counter()
                loss = model.training_step(batch, step)
                optimizers[name].zero_grad()
                loss.backward()
                optimizers[name].step()
                if step >= 2:
                    times[name].append(time.perf_counter() - start)
                assert torch.isfinite(loss)
    finally:
        torch.set_num_threads(threads)
    print("\nms per training step (B=32, hidden 200, 300-d frozen vectors, 1 thread): "
          + ", ".join(f"{k} {1000 * statistics.median(v):.1f}" for k, v in times.items()))


def test_routing_entropy_is_of_the_whole_splits_mean_q_however_it_is_batched():
    """H(q-bar) over a split: q-bar = (0.5, 0.25, 0.25) from three examples routed (1,0,0),
    (0.5,0.5,0) and (0,0.25,0.75) -> H = 1.5 ln 2, however the examples are batched (a mean
    of per-batch entropies would give (0 + H(0.25, 0.375, 0.375)) / 2 = 0.541 for the
    batches [1], [2, 3] instead of 1.040)."""
    from lit_models.metrics import RoutingEntropy

    q = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.25, 0.75]], dtype=torch.float64)
    log_q = q.clamp_min(1e-300).log()
    expected = 1.5 * math.log(2)
    for split in ([3], [1, 2], [2, 1], [1, 1, 1]):
        metric = RoutingEntropy(3)
        for part in torch.split(log_q, split):
            metric.update(part)
        assert metric.compute().item() == pytest.approx(expected, rel=1e-6), split
