"""CoDA Table 1's pieces on small files written here in the published formats: SearchQA's
txt splits and Quasar-T's gzipped JSON lines (parsing, token-level span labelling, the
training window), the three answer metrics against hand-computed values, and DecaProp's
layers against their naive formulas (the factorization machine, BAC's features, span
decoding), padding invariance, the softmax/CoDA swap and one optimiser step."""

from __future__ import annotations

import gzip
import json
import logging
from itertools import combinations
from pathlib import Path

import pytest
import torch

from attention import build
from datamodules.common import DataFormatError
from datamodules.open_qa import (
    QuasarTDataModule,
    SearchQADataModule,
    find_span,
    read_quasar,
    read_searchqa,
    training_window,
)
from lit_models import qa_metrics as qa
from lit_models.decaprop import DecaProp
from lit_models.decaprop_layers import (
    BidirectionalAttentionConnector,
    BiGRU,
    FactorizationMachine,
    best_spans,
)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNREPRO_COMPILE", "0")


# -- files in the published formats -------------------------------------------------------------
def searchqa_line(snippets: list[str], question: str, answer: str) -> str:
    return "  ".join(f"<s> {s} </s>" for s in snippets) + f" ||| {question} ||| {answer}"


SEARCHQA_TRAIN = [
    # answer repeated: the first occurrence is labelled
    searchqa_line(["the dog was owned by alice", "alice loved the dog"], "who owned the dog ?",
                  "alice"),
    # answer absent: dropped from training
    searchqa_line(["nothing here", "at all"], "who ?", "zed"),
    # answer in another case: labelled ignoring case
    searchqa_line(["Paris is in France"], "capital of france ?", "paris"),
    # multi-token answer, exact match preferred to an earlier case-folded one
    searchqa_line(["New York city", "i love new york"], "which city ?", "new york"),
]
SEARCHQA_EVAL = [searchqa_line(["the cat sat with bob", "bob is here"], "who sat ?", "bob"),
                 searchqa_line(["no answer in it"], "who ?", "carol")]


def write_searchqa(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text("\n".join(SEARCHQA_TRAIN) + "\n")
    for split in ("val", "test"):
        (folder / f"{split}.txt").write_text("\n".join(SEARCHQA_EVAL) + "\n")
    return folder


LONG_QUESTION = " ".join(f"w{i}" for i in range(30)) + " ?"
QUASAR = [  # (uid, question, answer, contexts)
    ("q1", "what is the capital of france ?", "Paris",
     ["France 's capital is paris .", "Paris, a city of France."]),
    ("q2", LONG_QUESTION, "rome", ["Rome is old ."]),
    ("q3", "who wrote hamlet ?", "marlowe", ["Shakespeare wrote Hamlet ."]),
]


def write_quasar(folder: Path, gz: bool = True, order=None) -> Path:
    order = order or QUASAR
    for name in ("train", "dev", "test"):
        q = "".join(json.dumps({"answer": a, "question": qs, "uid": u, "tags": []}) + "\n"
                    for u, qs, a, _ in QUASAR)
        c = "".join(json.dumps({"uid": u, "contexts": [[0.5, t] for t in ts]}) + "\n"
                    for u, _, _, ts in order)
        for path, text in ((folder / "questions" / f"{name}_questions.json", q),
                           (folder / "contexts" / "short" / f"{name}_contexts.json", c)):
            path.parent.mkdir(parents=True, exist_ok=True)
            if gz:
                with gzip.open(f"{path}.gz", "wt", encoding="utf-8") as f:
                    f.write(text)
            else:
                path.write_text(text)
    return folder


# -- parsing and span labelling -----------------------------------------------------------------
def test_searchqa_lines_parse_into_snippets_question_and_answer(tmp_path):
    rows = list(read_searchqa(write_searchqa(tmp_path) / "train.txt"))
    assert rows[0] == (1, ["the dog was owned by alice", "alice loved the dog"],
                       "who owned the dog ?", "alice")
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    (tmp_path / "bad.txt").write_text("<s> a </s> ||| only a question\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:1: expected '<s> snippet"):
        list(read_searchqa(tmp_path / "bad.txt"))


def test_spans_are_the_first_occurrence_exact_then_ignoring_case():
    words = "the dog was owned by alice alice loved".split()
    assert find_span(words, ["alice"]) == (5, 5)  # repeated: the first
    assert find_span("Paris is in France".split(), ["paris"]) == (0, 0)  # case
    assert find_span("New York city i love new york".split(), ["new", "york"]) == (5, 6)
    assert find_span("no answer".split(), ["zed"]) is None
    assert find_span("a b".split(), []) is None


def test_training_window_keeps_half_on_each_side_and_the_rest_near_an_edge():
    words = [f"w{i}" for i in range(20)]
    # middle: 2 before, the answer, 2 after (size 4)
    assert training_window(words, (10, 11), 4) == (words[8:14], (2, 3))
    # near the start: all 1 word before, the rest after (size - before = 3)
    assert training_window(words, (1, 1), 4) == (words[0:5], (1, 1))
    # near the end: all 2 after, before up to size - after = 2
    assert training_window(words, (17, 17), 4) == (words[15:20], (2, 2))
    # short context: everything
    assert training_window(words[:3], (1, 1), 10) == (words[:3], (1, 1))


def test_searchqa_datamodule_labels_tokens_and_drops_unanswerable_training_questions(tmp_path):
    dm = SearchQADataModule(data_dir=str(write_searchqa(tmp_path)), batch_size=8,
                            train_window=4)
    dm.setup()
    assert dm.read_stats["train"].questions == 4
    assert dm.read_stats["train"].dropped_no_answer == 1
    train = dm.datasets["train"]
    assert train.answers == [["alice"], ["paris"], ["new york"]]
    spans = {a[0]: tuple(s.tolist()) for a, s in zip(train.answers, train.spans)}
    texts = dict(zip([a[0] for a in train.answers], train.texts))
    # window of 4 around "alice" (token 5 of 10): 2 before, 2 after
    assert texts["alice"] == "owned by alice alice loved"
    assert spans["alice"] == (2, 2)
    assert texts["paris"].split()[spans["paris"][0]] == "Paris"
    # "new york" at the end: nothing after it, so 4 words before
    assert spans["new york"] == (4, 5) and texts["new york"] == "York city i love new york"
    val = dm.datasets["val"]
    assert val.spans.tolist() == [[4, 4], [-1, -1]]  # absent at evaluation: kept, no span
    batch = next(iter(dm.val_dataloader()))
    assert batch["answers"] == [["carol"], ["bob"]] or batch["answers"] == [["bob"], ["carol"]]
    assert batch["context"].shape[0] == 2 and batch["question_mask"].dtype == torch.bool
    ids = dm.datasets["train"].context_ids(0).tolist()
    assert [dm.vocab.itos[i] for i in ids] == "owned by alice alice loved".split()


def test_the_encoded_splits_are_cached_by_files_and_settings(tmp_path, monkeypatch):
    folder = str(write_searchqa(tmp_path / "data"))
    SearchQADataModule(data_dir=folder).setup()
    cached = list((tmp_path / "cache").glob("open_qa-searchqa-*.pt"))
    assert len(cached) == 1
    monkeypatch.setattr(SearchQADataModule, "read", None)  # a second build would fail
    again = SearchQADataModule(data_dir=folder)
    again.setup()
    assert again.datasets["train"].answers == [["alice"], ["paris"], ["new york"]]
    with pytest.raises(TypeError):  # other settings: built again
        SearchQADataModule(data_dir=folder, train_window=8).setup()


def test_evaluation_contexts_are_truncated_and_spans_past_the_cut_absent(tmp_path):
    dm = SearchQADataModule(data_dir=str(write_searchqa(tmp_path)), max_context=4)
    dm.setup()
    val = dm.datasets["val"]
    assert [len(t.split()) for t in val.texts] == [4, 4]
    assert val.spans.tolist() == [[-1, -1], [-1, -1]]  # "bob" was token 4


@pytest.mark.parametrize("gz", [True, False])
def test_quasar_t_reads_gzipped_or_gunzipped_json_lines_in_matching_order(tmp_path, gz):
    dm = QuasarTDataModule(data_dir=str(write_quasar(tmp_path, gz=gz)), max_question=25)
    assert dm.files("val")[0].name == ("dev_questions.json.gz" if gz else "dev_questions.json")
    dm.setup()
    train = dm.datasets["train"]
    assert dm.read_stats["train"].dropped_no_answer == 1  # marlowe
    assert train.qids == ["q1", "q2"]
    # q1: spaCy tokens of both contexts in file order; the exact "Paris" (second context)
    # wins over the earlier "paris" that matches only ignoring case
    tokens = train.texts[0].split(" ")
    assert tokens[:6] == ["France", "'s", "capital", "is", "paris", "."]
    start, end = train.spans[0].tolist()
    assert tokens[start:end + 1] == ["Paris"] and start == 6
    assert len(train.question_ids(1)) == 25  # 31 tokens truncated to qmax
    assert dm.datasets["test"].spans.tolist()[2] == [-1, -1]


def test_quasar_t_files_out_of_order_name_both_lines(tmp_path):
    folder = write_quasar(tmp_path, order=[QUASAR[1], QUASAR[0], QUASAR[2]])
    with pytest.raises(DataFormatError, match=r"train_contexts.json.gz:1: expected uid 'q1'"):
        list(read_quasar(folder / "questions" / "train_questions.json.gz",
                         folder / "contexts" / "short" / "train_contexts.json.gz"))


def test_bad_files_are_one_error_naming_file_and_line(tmp_path):
    (tmp_path / "bytes.txt").write_bytes(b"<s> caf\xe9 </s> ||| q ||| a\n")
    with pytest.raises(DataFormatError, match=r"bytes.txt:1: expected UTF-8 text"):
        list(read_searchqa(tmp_path / "bytes.txt"))
    folder = write_quasar(tmp_path / "q")
    questions = folder / "questions" / "train_questions.json.gz"
    short = folder / "contexts" / "short" / "train_contexts.json.gz"
    with gzip.open(short, "wt") as f:  # one record fewer than the questions
        f.write("".join(json.dumps({"uid": u, "contexts": []}) + "\n" for u, *_ in QUASAR[:2]))
    with pytest.raises(DataFormatError, match=r"train_contexts.json.gz: expected one record "
                                              r"per record of .*2 records"):
        list(read_quasar(questions, short))
    short.write_text("not gzip\n")
    with pytest.raises(DataFormatError, match=r"train_contexts.json.gz: expected .*\(gzip\)"):
        list(read_quasar(questions, short))


def test_glove_rows_frozen_zero_for_unknown_words_and_absent_file_warns(tmp_path, caplog):
    folder = write_searchqa(tmp_path / "data")
    glove = tmp_path / "glove.txt"
    glove.write_text("alice " + " ".join(["0.5"] * 8) + "\nbob " + " ".join(["1"] * 8) + "\n")
    dm = SearchQADataModule(data_dir=str(folder), vectors=str(glove), vectors_dim=8)
    weight = dm.embeddings
    assert weight.shape == (dm.vocab_size, 8)
    assert torch.equal(weight[dm.vocab["alice"]], torch.full((8,), 0.5))
    assert torch.equal(weight[dm.vocab["dog"]], torch.zeros(8))  # no vector: zero (DecaProp)
    absent = SearchQADataModule(data_dir=str(folder), vectors=str(tmp_path / "none.txt"))
    with caplog.at_level(logging.WARNING):
        assert absent.embeddings is None
    assert "randomly initialised embedding" in caplog.text and "none.txt" in caplog.text


# -- metrics, by hand -------------------------------------------------------------------------
def test_squad_exact_match_and_f1_by_hand():
    assert qa.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert qa.exact_match("the Eiffel Tower", ["Eiffel tower."]) == 1.0
    assert qa.exact_match("Eiffel", ["Eiffel tower", "eiffel"]) == 1.0  # max over golds
    # pred "new york city" vs gold "new york": 2 common, P = 2/3, R = 1, F1 = 0.8
    assert qa.f1("new york city", ["new york"]) == pytest.approx(0.8)
    # bag of tokens: pred "a b b" is "b b" (articles removed), gold "b b b c": common 2
    # (b twice), P = 2/2, R = 2/4, F1 = 2/3
    assert qa.f1("a b b", ["b b b c"]) == pytest.approx(2 / 3)
    assert qa.f1("x", ["y", "x y"]) == pytest.approx(2 / 3)  # max: 0 and 2*1*0.5/1.5
    assert qa.f1("the", ["a"]) == 0.0


def test_quasar_official_metric_by_hand():
    # spaces removed: "new york" and "newyork" are the same answer (SQuAD: not)
    assert qa.quasar_exact_match("New York", ["newyork"]) == 1.0
    assert qa.exact_match("New York", ["newyork"]) == 0.0
    # token sets: pred "b b c" -> {b, c}, gold "b d" -> {b, d}: overlap 1, P 1/2, R 1/2
    assert qa.quasar_f1("b b c", ["b d"]) == pytest.approx(0.5)
    assert qa.f1("b b c", ["b d"]) == pytest.approx(0.4)  # SQuAD counts: P 1/3, R 1/2
    # an article token cleans to "" and stays in the set: {"", cat} vs {cat}: P 1/2, R 1
    assert qa.quasar_f1("the cat", ["cat"]) == pytest.approx(2 / 3)
    assert qa.f1("the cat", ["cat"]) == 1.0


def test_searchqa_protocol_scores_unigram_questions_by_em_of_one_token():
    model = tiny_model()
    text = "x1 alan turing x2 x3"
    batch = {"context_text": [text, text], "answers": [["turing"], ["alan turing"]],
             "index": torch.tensor([0, 1]), "qid": ["a", "b"]}
    # full decoding picked "alan turing" for both; the 1-token decoding "turing", the
    # 3-token decoding "alan turing x2"
    spans = {15: [[1, 1], [2, 2]], 1: [[2, 2], [2, 2]], 3: [[1, 1], [3, 3]]}
    uni, ngram = (model._score(batch, i, spans) for i in (0, 1))
    assert uni["prediction"] == "alan turing" and uni["exact_match"] == 0.0
    assert uni["f1"] == pytest.approx(2 / 3)
    assert (uni["protocol"], uni["protocol_prediction"], uni["exact_match_unigram"]) == \
        ("unigram", "turing", 1.0)
    assert (ngram["protocol"], ngram["protocol_prediction"]) == ("ngram", "alan turing x2")
    assert ngram["f1_ngram"] == pytest.approx(0.8)  # F1, P 2/3, R 1
    assert "f1_ngram" not in uni and "exact_match_unigram" not in ngram  # one half each
    assert ngram["correct"] is True and ngram["exact_match"] == 1.0


# -- layers against their naive formulas -------------------------------------------------------
def test_factorization_machine_equals_the_naive_pairwise_sum():
    torch.manual_seed(0)
    fm = FactorizationMachine(p=6, k=3).double()
    with torch.no_grad():
        fm.w0.fill_(0.3)
        fm.w.normal_()
    x = torch.randn(4, 6, dtype=torch.float64)
    naive = fm.w0 + x @ fm.w + sum(
        (fm.v[i] @ fm.v[j]) * x[:, i] * x[:, j] for i, j in combinations(range(6), 2))
    torch.testing.assert_close(fm(x), naive)


def test_bac_gives_six_features_per_token_three_without_intra():
    torch.manual_seed(0)
    a, b = torch.randn(2, 7, 8), torch.randn(2, 5, 8)
    ma, mb = torch.ones(2, 7, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    ma[1, 4:] = False
    fa, fb = BidirectionalAttentionConnector(8, factor=4)(a, b, ma, mb)
    assert fa.shape == (2, 7, 6) and fb.shape == (2, 5, 6)
    assert torch.equal(fa[1, 4:], torch.zeros(3, 6))  # padded tokens: 0
    fa3, _ = BidirectionalAttentionConnector(8, factor=4, intra=False)(a, b, ma, mb)
    assert fa3.shape == (2, 7, 3)


@pytest.mark.parametrize("encoder_bac", [False, True])
def test_decacore_width_is_2dL_plus_6L_squared(encoder_bac):
    model = tiny_model(encoder_bac=encoder_bac)
    d, layers = 4, 2
    assert model.net.dim == 2 * d * layers + 6 * layers ** 2
    assert len(model.net.core) == layers ** 2
    extra = 6 if encoder_bac else 0  # the first commit: [c_l; BAC(c_l, q_l)] feeds layer l+1
    assert model.net.encoder[1].forward_gru.input_size == 2 * d + extra
    c, q = model.net.encode(*inputs(batch_of_four())[:4])
    assert c.shape[-1] == q.shape[-1] == model.net.dim


def test_bigru_equals_torchs_bidirectional_gru_over_packed_sequences():
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    ours = BiGRU(5, 3, dropout=0.0)
    reference = torch.nn.GRU(5, 3, batch_first=True, bidirectional=True)
    with torch.no_grad():
        for name, value in ours.forward_gru.named_parameters():
            getattr(reference, name).copy_(value)
        for name, value in ours.backward_gru.named_parameters():
            getattr(reference, f"{name}_reverse").copy_(value)
    x, lengths = torch.randn(3, 7, 5), torch.tensor([7, 4, 1])
    mask = torch.arange(7)[None] < lengths[:, None]
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    expected, _ = pad_packed_sequence(reference(packed)[0], batch_first=True, total_length=7)
    torch.testing.assert_close(ours(x, mask), expected)


def test_best_span_equals_the_naive_double_loop():
    torch.manual_seed(1)
    ls = torch.log_softmax(torch.randn(5, 9), -1)
    le = torch.log_softmax(torch.randn(5, 9), -1)
    ls[3, 6:] = le[3, 6:] = float("-inf")  # padding
    le[4] = ls[4] = 0.0  # all tied: the first (i, j)
    for max_span in (1, 3, 15):
        start, end, score = best_spans(ls, le, max_span)
        for b in range(5):
            best = max(((ls[b, i] + le[b, j]).item(), -i, -j) for i in range(9)
                       for j in range(i, min(i + max_span, 9)))
            assert (start[b].item(), end[b].item()) == (-best[1], -best[2])
            assert score[b].item() == pytest.approx(best[0])


# -- the model ---------------------------------------------------------------------------------
def tiny_model(attention: str = "softmax", encoder_bac: bool = False, seed: int = 0,
               dropout: float = 0.0) -> DecaProp:
    torch.manual_seed(seed)
    return DecaProp(vocab_size=40, embedding_dim=6, hidden=4, layers=2, factor=4,
                    dropout=dropout, attention=build(attention), encoder_bac=encoder_bac)


def batch_of_four() -> dict:
    g = torch.Generator().manual_seed(3)
    lengths = [30, 22, 17, 9]
    context = torch.randint(2, 40, (4, 30), generator=g)
    mask = torch.arange(30)[None] < torch.tensor(lengths)[:, None]
    context = context.masked_fill(~mask, 0)
    question = torch.randint(2, 40, (4, 6), generator=g)
    qmask = torch.ones(4, 6, dtype=torch.bool)
    qmask[2, 4:] = False
    question = question.masked_fill(~qmask, 0)
    return {"context": context, "context_mask": mask, "question": question,
            "question_mask": qmask, "start": torch.tensor([3, 10, 0, 8]),
            "end": torch.tensor([5, 10, 2, 8])}


def inputs(batch: dict) -> tuple:
    return batch["context"], batch["context_mask"], batch["question"], batch["question_mask"]


@pytest.mark.parametrize("attention", ["softmax", "coda"])
def test_padding_changes_nothing(attention):
    model = tiny_model(attention).eval()
    batch = batch_of_four()
    with torch.no_grad():
        out = model(batch)
        for i, n in enumerate(batch["context_mask"].sum(1).tolist()):
            q = int(batch["question_mask"][i].sum())
            alone = {"context": batch["context"][i:i + 1, :n],
                     "context_mask": batch["context_mask"][i:i + 1, :n],
                     "question": batch["question"][i:i + 1, :q],
                     "question_mask": batch["question_mask"][i:i + 1, :q]}
            single = model(alone)
            torch.testing.assert_close(out.start_logits[i, :n], single.start_logits[0])
            torch.testing.assert_close(out.end_logits[i, :n], single.end_logits[0])
            assert torch.isinf(out.start_logits[i, n:]).all()


def test_swapping_softmax_for_coda_changes_only_the_context_query_attention():
    soft, coda = tiny_model("softmax"), tiny_model("coda")
    a, b = soft.state_dict(), coda.state_dict()
    assert a.keys() == b.keys()  # CoDA's alignment has no parameters of its own
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert type(soft.net.cq_attention).__name__ == "SoftmaxAlignment"
    assert type(coda.net.cq_attention).__name__ == "CodaAlignment"
    batch = batch_of_four()
    soft.eval()
    coda.eval()
    with torch.no_grad():
        cs, qs = soft.net.encode(*inputs(batch))
        cc, qc = coda.net.encode(*inputs(batch))
        torch.testing.assert_close(cs, cc)  # everything before it: the same
        torch.testing.assert_close(qs, qc)
        args = (cs, qs, batch["context_mask"], batch["question_mask"])
        (ts, ws), (tc, wc) = soft.net.attend(*args), coda.net.attend(*args)
        assert not torch.allclose(ts, tc)  # the attention itself differs
        torch.testing.assert_close(ws.sum(-1)[batch["context_mask"]],
                                   torch.ones(int(batch["context_mask"].sum())))
        # quasi-attention: in [-1, 1] (here [0, 1): ReLU features make E >= 0), rows that do
        # not sum to 1
        assert (wc.abs() < 1).all()
        assert not torch.allclose(wc.sum(-1)[batch["context_mask"]],
                                  torch.ones(int(batch["context_mask"].sum())))
        # and CoDA's options as the model's docstring says: beta D'^(-1/4), centred gate
        opts = coda.net.cq_attention.options
        assert opts["gate"] == "centered" and opts["scale"] is False
        assert opts["beta"] == pytest.approx(coda.net.dim ** -0.25)


def test_unsupported_mechanism_is_refused_when_the_model_is_built():
    from attention import REGISTRY

    unable = [n for n, cls in REGISTRY.items() if not cls().supports("alignment")]
    if not unable:
        pytest.skip("every registered mechanism supports the alignment context")
    with pytest.raises(ValueError, match="cannot be used for alignment attention"):
        tiny_model(unable[0])


@pytest.mark.parametrize("attention", ["softmax", "coda"])
def test_one_optimiser_step_lowers_the_loss(attention):
    model = tiny_model(attention)
    batch = batch_of_four()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    torch.manual_seed(0)
    before = model.span_loss(model(batch), batch["start"], batch["end"]).mean()
    before.backward()
    model.on_before_optimizer_step(optimizer)  # per-tensor clipping
    assert all(p.grad.norm() <= 5.0 + 1e-5 for p in model.parameters() if p.grad is not None)
    optimizer.step()
    with torch.no_grad():
        after = model.span_loss(model(batch), batch["start"], batch["end"]).mean()
    assert after < before


# -- getting the files (datamodules.fetch) -------------------------------------------------------
def test_missing_searchqa_says_where_to_get_it(tmp_path):
    dm = SearchQADataModule(data_dir=str(tmp_path / "searchqa"))
    with pytest.raises(FileNotFoundError, match=r"train.txt.*dl4ir-searchQA"):
        dm.setup()


def test_missing_quasar_t_is_downloaded_from_the_release_urls(tmp_path, monkeypatch):
    from datamodules import fetch

    source = write_quasar(tmp_path / "release")
    urls = []

    def downloader(url, dest, **_):
        urls.append(url)
        relative = url.split("/quasar-t/", 1)[1]
        Path(dest).write_bytes((source / relative).read_bytes())
        return dest

    monkeypatch.setattr(fetch, "download_file", downloader)
    offline = QuasarTDataModule(data_dir=str(tmp_path / "quasar_t"), download=False)
    with pytest.raises(FileNotFoundError, match="curtis.ml.cmu.edu/datasets/quasar/quasar-t/"):
        offline.setup()
    dm = QuasarTDataModule(data_dir=str(tmp_path / "quasar_t"))
    dm.setup()
    assert sorted(urls) == sorted(
        f"http://curtis.ml.cmu.edu/datasets/quasar/quasar-t/{kind}/{split}_{what}.json.gz"
        for kind, what in (("questions", "questions"), ("contexts/short", "contexts"))
        for split in ("train", "dev", "test"))
    assert dm.datasets["train"].qids == ["q1", "q2"]
