"""BLEU (lit_models/bleu.py) against sacreBLEU's own command line on the first 200 lines of
the real IWSLT'15 tst2012.vi and a perturbed copy, the WMT'14 En-De compound splitting
against the perl one-liner of tensor2tensor's get_ende_bleu.sh on the real newstest2014
file and on a hand-computed example, edge cases, and the decoded-output file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_models.bleu import (
    detokenized_bleu,
    split_compounds,
    tokenized_bleu,
    write_hypotheses,
)
from tests.conftest import perturbed

SACREBLEU = Path(sys.executable).parent / "sacrebleu"
PERL_SPLIT = r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"  # get_ende_bleu.sh, compound_split_bleu.sh


@pytest.fixture
def iwslt(shared, tmp_path):
    """(hypotheses, references, hypothesis file, reference file): tst2012.vi's first 200."""
    lines = shared("iwslt15_en_vi/tst2012.vi").read_text(encoding="utf-8").splitlines()[:200]
    hyps = [perturbed(i, line) for i, line in enumerate(lines)]
    ref_file, hyp_file = tmp_path / "ref.vi", tmp_path / "hyp.vi"
    ref_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    hyp_file.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    return hyps, lines, hyp_file, ref_file


def sacrebleu_cli(ref: Path, hyp: Path, *options: str) -> str:
    p = subprocess.run([str(SACREBLEU), str(ref), "-i", str(hyp), "-w", "6", *options],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_detokenized_bleu_equals_the_sacrebleu_command_line(iwslt):
    hyps, refs, hyp_file, ref_file = iwslt
    assert sum(h == "" for h in hyps) == 20
    result = detokenized_bleu(hyps, refs)
    cli = json.loads(sacrebleu_cli(ref_file, hyp_file, "-f", "json"))
    assert result.score == pytest.approx(cli["score"], abs=1e-6)
    assert 20 < result.score < 90  # perturbed, not identical and not unrelated
    assert result.signature == cli["signature"]
    assert "tok:13a" in result.signature and "case:mixed" in result.signature
    bp, ratio, hyp_len, ref_len = re.search(
        r"BP = ([\d.]+) ratio = ([\d.]+) hyp_len = (\d+) ref_len = (\d+)",
        cli["verbose_score"]).groups()
    assert (result.sys_len, result.ref_len) == (int(hyp_len), int(ref_len))
    assert result.sys_len < result.ref_len and result.bp == pytest.approx(float(bp), abs=5e-4)
    shown = "/".join(f"{p:.1f}" for p in result.precisions)
    assert cli["verbose_score"].startswith(shown + " ")


def test_tokenized_bleu_equals_the_command_line_with_tok_none(iwslt):
    hyps, refs, hyp_file, ref_file = iwslt
    result = tokenized_bleu(hyps, refs)
    score = float(sacrebleu_cli(ref_file, hyp_file, "-tok", "none", "-b"))
    assert result.score == pytest.approx(score, abs=1e-6)
    assert result.signature.startswith("nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|")
    # the Stanford files are tokenized already, so 13a re-tokenizes very little: close, not equal
    assert result.score != detokenized_bleu(hyps, refs).score
    assert result.sys_len == sum(len(h.split()) for h in hyps)


def test_compound_splitting_on_a_hand_made_example():
    ref = "das rich-text Format ist gut ."
    hyp = "das rich-Text Format ist gut ."
    assert split_compounds(ref) == "das rich ##AT##-##AT## text Format ist gut ."
    # perl's /g: left to right, not overlapping; only between two non-space characters
    assert split_compounds("gut-und-schön a-b-c x--y -a b- ---") == (
        "gut ##AT##-##AT## und ##AT##-##AT## schön a ##AT##-##AT## b-c "
        "x ##AT##-##AT## -y -a b- - ##AT##-##AT## -")
    # unsplit, 6 tokens with the 2nd wrong: p1..p4 = 5/6, 3/5, 2/4, 1/3
    plain = tokenized_bleu([hyp], [ref])
    assert plain.score == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    # split, 8 tokens with the 4th wrong: 7/8, 5/7, 3/6, 1/5 -> (1/16)^(1/4) = 0.5
    split = tokenized_bleu([hyp], [ref], compound_split=True)
    assert split.score == pytest.approx(50.0)
    assert split.precisions == pytest.approx((100 * 7 / 8, 100 * 5 / 7, 50.0, 20.0))
    assert (split.sys_len, split.ref_len) == (8, 8) and split.bp == 1.0
    assert "tok:none+compound-split" in split.signature
    assert "compound" not in plain.signature and "tok:none" in plain.signature


def test_compound_splitting_equals_the_perl_one_liner_on_newstest2014(shared):
    if shutil.which("perl") is None:
        pytest.skip("perl is not installed")
    path = shared("wmt14_en_de/newstest2014-deen-ref.de.sgm")
    p = subprocess.run(["perl", "-ple", PERL_SPLIT], input=path.read_bytes(),
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    expected = p.stdout.decode("utf-8").splitlines()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert sum("##AT##" in line for line in expected) > 100
    assert [split_compounds(line) for line in lines] == expected


def test_empty_hypotheses_and_mismatched_line_counts():
    empty = tokenized_bleu(["", ""], ["a b c d", "e f"])
    assert empty.score == 0.0 and empty.sys_len == 0 and empty.ref_len == 6
    assert detokenized_bleu(["", ""], ["a b c d", "e f"]).score == 0.0
    with pytest.raises(ValueError, match="got 3 hypotheses and 2 references"):
        tokenized_bleu(["a", "b", "c"], ["a", "b"])
    with pytest.raises(ValueError, match="got 1 hypotheses and 2 references"):
        detokenized_bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="hypothesis 2 must be one line"):
        detokenized_bleu(["a", "b\nc"], ["a", "b"])


def test_write_hypotheses_one_json_line_per_example(tmp_path):
    path = write_hypotheses(tmp_path / "decoded" / "test.jsonl", torch.tensor([7, 3]),
                            ["a\tb", 'say "hi"'], ["Xin chào .", ""], ["Chào bạn .", "x"])
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == [
        {"id": 7, "source": "a\tb", "hypothesis": "Xin chào .", "reference": "Chào bạn ."},
        {"id": 3, "source": 'say "hi"', "hypothesis": "", "reference": "x"}]
    assert "chào" in path.read_text(encoding="utf-8")  # UTF-8, not \u escapes
    with pytest.raises(ValueError, match="got 2 ids, 2 sources, 1 hypotheses, 2 references"):
        write_hypotheses(tmp_path / "x.jsonl", [1, 2], ["a", "b"], ["a"], ["a", "b"])
    # with the beam's scores: one more field per row
    path = write_hypotheses(tmp_path / "scored.jsonl", [0], ["s"], ["h"], ["r"], [-1.2345678])
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "id": 0, "source": "s", "hypothesis": "h", "reference": "r", "score": -1.234568}
    with pytest.raises(ValueError, match="1 references, 2 scores"):
        write_hypotheses(tmp_path / "x.jsonl", [1], ["a"], ["a"], ["a"], [0.0, 1.0])
