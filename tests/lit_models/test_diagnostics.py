"""The CoDA gate diagnostics (lit_models/diagnostics.py): every logged figure against the
paper's formula computed by hand on a fixed batch, and the figures in a run's metrics.csv."""

from __future__ import annotations

import csv
import inspect
import math

import pytest
import torch

from attention import build
from lit_models.decomp_att import DecompAtt
from lit_models.diagnostics import FIGURES, CodaDiagnostics, module_label
from lit_models.transformer import TransformerSeq2Seq
from tests.conftest import ROOT, heads, run

DT = torch.float64


def naive_figures(q, k, valid, gate, alpha=1.0, beta=1.0, scale=True, centered=False):
    """The six figures from the paper's formulas, entry by entry (q (B,H,Lq,d), k (B,H,Lk,d),
    valid (B,H,Lq,Lk) boolean): E = q.k / sqrt(d), N = -beta ||q - k||_1 / sqrt(d) (Eq. 10),
    centred per query row over the valid entries when ``centered`` (Eq. 4)."""
    b, h, lq, d = q.shape
    lk = k.shape[2]
    s = 1 / math.sqrt(d) if scale else 1.0
    entries, rows = [], []
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                cols = [j for j in range(lk) if valid[bi, hi, i, j]]
                ns = {j: -beta * s * float((q[bi, hi, i] - k[bi, hi, j]).abs().sum())
                      for j in cols}
                mean_n = sum(ns.values()) / len(ns) if centered and ns else 0.0
                row = 0.0
                for j in cols:
                    te = math.tanh(alpha * s * float(q[bi, hi, i] @ k[bi, hi, j]))
                    sg = 1 / (1 + math.exp(-(ns[j] - mean_n)))
                    g = 2 * sg if gate == "scaled" else sg
                    entries.append((te, sg, g, te * g))
                    row += te * g
                if cols:
                    rows.append(abs(row))
    n = len(entries)
    return {"gate_mean": sum(e[2] for e in entries) / n,
            "gate_shut": sum(e[1] < 0.05 for e in entries) / n,
            "gate_open": sum(e[1] > 0.95 for e in entries) / n,
            "m_abs": sum(abs(e[3]) for e in entries) / n,
            "row_sum_abs": sum(rows) / len(rows),
            "e_negative": sum(e[0] < 0 for e in entries) / n}


def keep(store: dict, key, value) -> None:
    """A forward hook's body: keep the first call's value (returns None, so the module's
    output is left as it is)."""
    store.setdefault(key, value)


def seq2seq_batch():
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 4, 3, 0, 0], [6, 6, 5, 3, 0]])
    tgt_in = torch.tensor([[2, 7, 8, 5], [2, 9, 0, 0], [2, 4, 4, 0]])
    tgt_out = torch.tensor([[7, 8, 5, 3], [9, 3, 0, 0], [4, 4, 3, 0]])
    return {"src": src, "src_mask": src != 0, "tgt_in": tgt_in, "tgt_out": tgt_out,
            "tgt_mask": tgt_out != 0}


@pytest.mark.parametrize("options", [dict(), dict(gate="centered"), dict(beta=0.25)],
                         ids=["scaled", "centered", "beta0.25"])
def test_transformer_figures_match_the_formula_by_hand(options):
    """Every CoDA module of a 2+2-layer CoDA Transformer (encoder self, decoder self,
    cross), with padding in source and target: the logged figures equal the paper's
    formula over the entries the masks allow (real keys, causal, real queries)."""
    torch.manual_seed(0)
    model = TransformerSeq2Seq(13, 11, pad_id=0, d_model=16, n_heads=2, d_ff=32,
                               n_encoder_layers=2, n_decoder_layers=2,
                               attention=build("coda", **options)).double()
    model.train()  # the callback switches dropout off and restores the mode
    batch = seq2seq_batch()
    inputs = {}
    hooks = [mod.register_forward_hook(
        lambda m, args, kwargs, out, path=path: keep(
            inputs, path, inspect.signature(m.forward).bind(*args, **kwargs).arguments),
        with_kwargs=True)
        for path, mod in model.named_modules() if path.endswith(("self_attn", "cross_attn"))]
    figures = CodaDiagnostics().figures(model, batch)
    assert model.training
    for hook in hooks:
        hook.remove()
    labels = {module_label(p + ".core") for p in inputs}
    assert labels == {f"{side}.{layer}.{kind}" for side, kind in
                      (("encoder", "self"), ("decoder", "self"), ("decoder", "cross"))
                      for layer in (0, 1)}
    assert set(figures) == {f"coda/{label}/{f}" for label in labels for f in FIGURES}
    gate = options.get("gate", "scaled")
    for path, call in inputs.items():
        query, key_value, key_mask = call["query"], call["key_value"], call["key_mask"]
        causal = call.get("causal", False)
        mha = model.get_submodule(path)
        q, k = heads(mha.q_proj(query), 2), heads(mha.k_proj(key_value), 2)
        lq, lk = q.shape[2], k.shape[2]
        valid = key_mask[:, None, None, :].expand(3, 2, lq, lk).clone()
        if causal:
            valid &= torch.ones(lq, lk, dtype=torch.bool).tril()
        queries = batch["src_mask"] if path.startswith("encoder") else batch["tgt_mask"]
        valid &= queries[:, None, :, None]
        label = module_label(path + ".core")
        # the encoder centres per matrix (next test); decoder self and cross per row
        if gate == "centered" and label.startswith("encoder"):
            continue
        expected = naive_figures(q.detach(), k.detach(), valid, gate,
                                 beta=options.get("beta", 1.0), centered=gate == "centered")
        for name, value in expected.items():
            assert figures[f"coda/{label}/{name}"] == pytest.approx(value, abs=1e-9), \
                (label, name)


def test_encoder_centred_per_matrix_by_hand():
    """Encoder self-attention centres N over the real x real entries of each head's matrix
    (Eq. 4): the gate figures by hand with that mean."""
    torch.manual_seed(1)
    model = TransformerSeq2Seq(13, 11, pad_id=0, d_model=16, n_heads=2, d_ff=32,
                               n_encoder_layers=1, n_decoder_layers=1,
                               attention=build("coda", gate="centered")).double()
    batch = seq2seq_batch()
    figures = CodaDiagnostics().figures(model, batch)
    mha = model.encoder.layers[0].self_attn
    x = {}
    hook = mha.register_forward_hook(lambda m, args, out: keep(x, "in", args[0]))
    with torch.no_grad():
        model.eval()
        model(batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_mask"])
    hook.remove()
    q, k = heads(mha.q_proj(x["in"]), 2), heads(mha.k_proj(x["in"]), 2)
    s = 1 / math.sqrt(8)
    gates, shut = [], []
    for bi in range(3):
        real = [i for i in range(5) if batch["src_mask"][bi, i]]
        for hi in range(2):
            ns = {(i, j): -s * float((q[bi, hi, i] - k[bi, hi, j]).abs().sum())
                  for i in real for j in real}
            mean = sum(ns.values()) / len(ns)
            for n in ns.values():
                gates.append(1 / (1 + math.exp(-(n - mean))))
                shut.append(gates[-1] < 0.05)
    assert figures["coda/encoder.0.self/gate_mean"] == pytest.approx(sum(gates) / len(gates),
                                                                     abs=1e-9)
    assert figures["coda/encoder.0.self/gate_shut"] == pytest.approx(sum(shut) / len(shut))


def test_decomposable_attention_alignment_figures():
    """DecompAtt's CoDA alignment (Eq. 1-3: no 1/sqrt(d), the plain gate): the figures over
    the real premise x hypothesis pairs."""
    torch.manual_seed(2)
    model = DecompAtt(vocab_size=20, num_classes=3, hidden=6,
                      attention=build("coda")).double()
    premise = torch.tensor([[4, 5, 6, 0], [7, 8, 9, 10]])
    hypothesis = torch.tensor([[11, 12, 0], [13, 14, 15]])
    batch = {"premise": premise, "premise_mask": premise != 0, "hypothesis": hypothesis,
             "hypothesis_mask": hypothesis != 0, "label": torch.tensor([0, 1])}
    core = model.net.align[0]
    seen = {}
    hook = core.register_forward_hook(lambda m, args, out: keep(seen, "ab", args))
    figures = CodaDiagnostics().figures(model, batch)
    hook.remove()
    a, b, mask_a, mask_b = seen["ab"][:4]
    a, b = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    valid = (mask_a.reshape(-1, a.shape[1])[:, :, None] & mask_b.reshape(-1, b.shape[1])[:, None])
    expected = naive_figures(a[:, None], b[:, None], valid[:, None], "plain", scale=False,
                             alpha=core.options["alpha"], beta=core.options["beta"])
    label = next(iter(CodaDiagnostics.modules(model)))
    for name, value in expected.items():
        assert figures[f"coda/{label}/{name}"] == pytest.approx(value, abs=1e-9), name


def test_a_model_without_coda_logs_nothing_and_bad_settings_are_refused():
    model = TransformerSeq2Seq(13, 11, pad_id=0, d_model=16, n_heads=2, d_ff=32)
    assert CodaDiagnostics().figures(model, seq2seq_batch()) == {}
    with pytest.raises(ValueError, match="every_n_steps"):
        CodaDiagnostics(every_n_steps=0)
    with pytest.raises(ValueError, match="src/tgt_in"):
        CodaDiagnostics().figures(
            TransformerSeq2Seq(13, 11, attention=build("coda")), {"x": torch.zeros(1)})


def test_figures_reach_metrics_csv_at_step_0_and_every_n_steps(env, tmp_path):
    """A smoke fit of the CoDA MLU Transformer with the callback on by flag: metrics.csv
    holds every module's figures at steps 0, 5, 10, 15 and 20, within their ranges."""
    run(ROOT / "experiments" / "coda_mlu.py",
        ["fit", "--config", "experiments/configs/coda_mlu/smoke.yaml",
         "--model.attention=coda", "--trainer.callbacks+=lit_models.diagnostics.CodaDiagnostics",
         "--trainer.callbacks.every_n_steps=5"], {**env, "WANDB_MODE": "disabled"})
    (metrics,) = (tmp_path / "runs").rglob("metrics.csv")
    rows = [r for r in csv.DictReader(open(metrics)) if r.get("coda/decoder.0.cross/gate_mean")]
    assert [int(r["step"]) for r in rows] == [0, 5, 10, 15, 20]
    for row in rows:
        for label in ("encoder.0.self", "decoder.0.self", "decoder.0.cross"):
            values = {f: float(row[f"coda/{label}/{f}"]) for f in FIGURES}
            assert 0 <= values["gate_mean"] <= 2  # the scaled gate 2 sigmoid(N)
            assert all(0 <= values[f] <= 1 for f in ("gate_shut", "gate_open", "e_negative",
                                                      "m_abs"))
            assert values["row_sum_abs"] >= 0
