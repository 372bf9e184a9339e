"""The rare-word analysis of the quantum-statistics attention paper's Table 4
(experiments/harness/rare_words.py) on small hand-made files whose answer is worked out by
hand in the comments: the frequency percentile groups, the mean frequencies and the
deviations, both input formats (plain text and the decoded ``hypotheses-<stage>.jsonl``),
the errors and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from datamodules.common import DataFormatError
from experiments.harness.rare_words import (
    analyse,
    frequency_groups,
    main,
    markdown_table,
    parse_groups,
    rare_word_deviation,
)
from lit_models.bleu import write_hypotheses

ROOT = Path(__file__).resolve().parents[2]

# The training text: 10 word types, 54 tokens.  Counts: the 10, a 9, cat 8, dog 7, sat 6,
# on 5, mat 4, blue 2, red 2, zebra 1.
TRAIN = ("the the the the the the the the the the a a a a a a a a a\n"
         "cat cat cat cat cat cat cat cat dog dog dog dog dog dog dog\n"
         "sat sat sat sat sat sat on on on on on mat mat mat mat\n"
         "blue blue red red zebra\n")
# Rarest first, ties (blue and red, 2 each) in code-point order:
#   rank r:  1 zebra, 2 blue, 3 red, 4 mat, 5 on, 6 sat, 7 dog, 8 cat, 9 a, 10 the.
# Group g = ceil(100 * r / n) with n = 10 types: g = 10 r, so groups 1-30 hold exactly one
# word each in groups 10 (zebra), 20 (blue) and 30 (red); the other 27 of groups 1-30 are
# empty and left out of the mean: P' = {10, 20, 30}.
REFERENCES = ["the cat sat on the red mat",      # 7 tokens, red (g30)
              "a dog sat on the mat",            # 6 tokens
              "the zebra and the blue cat"]      # 6 tokens, zebra (g10), blue (g20); "and":
#                                                  not a training word, in no group
# Reference: N_R = 19 tokens, one in each of groups 10, 20, 30:
#   F_R(10) = F_R(20) = F_R(30) = 100/19;  mean Fbar_R = (3 * 100/19) / 3 = 100/19 = 5.2632 %
SYSTEM_A = ["the cat sat on the mat",            # 6 tokens
            "a dog sat on the red mat",          # 7 tokens, red
            "the zebra and the cat"]             # 5 tokens, zebra
# A: N_A = 18; groups 10: 1, 20: 0, 30: 1 -> F_A = 100/18, 0, 100/18
#   Fbar_A = (200/18) / 3 = 200/54 = 3.7037 %
#   deviation = 100 * (Fbar_A - Fbar_R) / Fbar_R = 100 * ((200/54) / (100/19) - 1)
#             = 100 * (3800/5400 - 1) = 100 * (19/27 - 1) = -800/27 = -29.6296 %
#   per group: g10: 100 * ((100/18)/(100/19) - 1) = 100 * (19/18 - 1) = 100/18 = +5.5556 %,
#              g20: (0 - 100/19)/(100/19) = -100 %, g30: +5.5556 %
SYSTEM_B = ["the red cat sat on the red mat",    # 8 tokens, red x2
            "a blue dog sat on the zebra mat",   # 8 tokens, blue, zebra
            "the zebra and the blue cat"]        # 6 tokens, zebra, blue
# B: N_B = 22; groups 10: 2, 20: 2, 30: 2 -> F_B(p) = 200/22 each, Fbar_B = 200/22 = 100/11
#   deviation = 100 * ((100/11) / (100/19) - 1) = 100 * (19/11 - 1) = 800/11 = +72.7273 %
MEAN_REF, MEAN_A, MEAN_B = 100 / 19, 200 / 54, 100 / 11
DEV_A, DEV_B = -800 / 27, 800 / 11


def lines(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    (tmp_path / "train.vi").write_text(TRAIN, encoding="utf-8")
    return {"train": tmp_path / "train.vi", "ref": lines(tmp_path / "ref.vi", REFERENCES),
            "a": lines(tmp_path / "a.txt", SYSTEM_A), "b": lines(tmp_path / "b.txt", SYSTEM_B)}


def test_frequency_groups_by_hand():
    counts = Counter(TRAIN.split())
    assert sum(counts.values()) == 54 and len(counts) == 10
    groups = frequency_groups(counts)
    assert {w: g for w, g in groups.items() if g <= 30} == {"zebra": 10, "blue": 20, "red": 30}
    assert groups["mat"] == 40 and groups["the"] == 100
    # 4 groups of 10 words: g = ceil(4 r / 10): r 1-2 -> 1, 3-5 -> 2, 6-7 -> 3, 8-10 -> 4
    assert frequency_groups(counts, bins=4) == {
        "zebra": 1, "blue": 1, "red": 2, "mat": 2, "on": 2, "sat": 3, "dog": 3, "cat": 4,
        "a": 4, "the": 4}
    # most frequent first: the (r 1) -> 10, a -> 20, cat -> 30, ..., zebra -> 100
    frequent = frequency_groups(counts, order="frequent")
    assert {w: g for w, g in frequent.items() if g <= 30} == {"the": 10, "a": 20, "cat": 30}
    with pytest.raises(ValueError, match="order must be one of"):
        frequency_groups(counts, order="rarest")


def test_deviation_by_hand():
    groups = frequency_groups(Counter(TRAIN.split()))
    result = rare_word_deviation(groups, REFERENCES, {"A": SYSTEM_A, "B": SYSTEM_B})
    assert result["groups"] == [10, 20, 30] and result["vocabulary"] == 10
    ref = result["reference"]
    assert ref["tokens"] == 19 and ref["mean_frequency"] == pytest.approx(MEAN_REF)
    assert ref["frequencies"] == pytest.approx([100 / 19] * 3)
    a, b = result["systems"]["A"], result["systems"]["B"]
    assert (a["tokens"], b["tokens"]) == (18, 22)
    assert a["frequencies"] == pytest.approx([100 / 18, 0, 100 / 18])
    assert a["mean_frequency"] == pytest.approx(MEAN_A) and a["deviation"] == pytest.approx(DEV_A)
    assert a["group_deviations"] == pytest.approx([100 / 18, -100, 100 / 18])
    assert b["mean_frequency"] == pytest.approx(MEAN_B) and b["deviation"] == pytest.approx(DEV_B)
    # the reference against itself deviates by nothing
    same = rare_word_deviation(groups, REFERENCES, {"ref": REFERENCES})["systems"]["ref"]
    assert same["deviation"] == 0 and same["group_deviations"] == [0, 0, 0]


def test_other_groups_and_order(files):
    # --order frequent: groups 10, 20, 30 = the, a, cat.  Reference: the 5 (2 + 1 + 2), a 1,
    # cat 2 of 19 tokens -> mean (800/19)/3; A: the 5, a 1, cat 2 of 18 -> mean (800/18)/3;
    # deviation = 100 * (19/18 - 1) = +5.5556 %
    result = analyse(files["train"], [files["a"]], files["ref"], order="frequent")
    assert result["reference"]["mean_frequency"] == pytest.approx(800 / 57)
    assert result["systems"]["a"]["deviation"] == pytest.approx(100 / 18)
    # groups 1-40 add mat (group 40): reference 2 of 19, A 2 of 18 (lines 1 and 2)
    #   Fbar_R = (3 + 2) * 100/19 / 4, Fbar_A = (2 + 2) * 100/18 / 4
    #   deviation = 100 * ((400/18) / (500/19) - 1) = 100 * (7600/9000 - 1) = -15.5556 %
    result = analyse(files["train"], [files["a"]], files["ref"], groups=parse_groups("1-40"))
    assert result["groups"] == [10, 20, 30, 40]
    assert result["systems"]["a"]["deviation"] == pytest.approx(100 * (7600 / 9000 - 1))
    assert parse_groups("1,5,10-12") == [1, 5, 10, 11, 12]
    with pytest.raises(ValueError, match="none of the groups 1-9 holds a training word"):
        analyse(files["train"], [files["a"]], files["ref"], groups=range(1, 10))


def test_plain_text_and_jsonl_give_the_same_table(files, tmp_path):
    plain = analyse(files["train"], [files["a"], files["b"]], files["ref"])
    assert list(plain["systems"]) == ["a", "b"]
    assert plain["systems"]["a"]["deviation"] == pytest.approx(DEV_A)
    assert plain["systems"]["b"]["deviation"] == pytest.approx(DEV_B)
    # the decoded output of a run: in batch order (ids 2, 0, 1), as write_hypotheses writes it
    order = [2, 0, 1]
    for name, system in (("a", SYSTEM_A), ("b", SYSTEM_B)):
        write_hypotheses(tmp_path / name / "hypotheses-test.jsonl", order,
                         [f"src {i}" for i in order], [system[i] for i in order],
                         [REFERENCES[i] for i in order])
    jsonl = [tmp_path / "a" / "hypotheses-test.jsonl", tmp_path / "b" / "hypotheses-test.jsonl"]
    # no --references: those of the .jsonl files; the same stems: the paths name the columns
    result = analyse(files["train"], jsonl)
    assert list(result["systems"]) == [str(p) for p in jsonl]
    assert result["references"].endswith("hypotheses-test.jsonl (its references)")
    for got, want in zip(result["systems"].values(), plain["systems"].values()):
        assert got["deviation"] == pytest.approx(want["deviation"])
        assert got["frequencies"] == pytest.approx(want["frequencies"])
    # mixed, with the reference file and names
    mixed = analyse(files["train"], [jsonl[0], files["b"]], files["ref"], names=["MQT", "base"])
    assert mixed["systems"]["MQT"]["deviation"] == pytest.approx(DEV_A)
    assert mixed["systems"]["base"]["deviation"] == pytest.approx(DEV_B)
    assert mixed["reference"]["mean_frequency"] == pytest.approx(MEAN_REF)


def test_markdown_table(files):
    table = markdown_table(analyse(files["train"], [files["a"], files["b"]], files["ref"]),
                           per_group=True)
    assert table.split("\n") == [
        "Rare-word frequency groups 10,20,30 of 100 (rarest first) of 10 training words; "
        "frequencies in % of each text's tokens.",
        "",
        "| | reference | a | b |",
        "|---|---:|---:|---:|",
        "| mean frequency (%) | 5.26 | 3.70 | 9.09 |",
        "| deviation (%) | | -29.63 | +72.73 |",
        "| group 10 (%) | 5.26 | 5.56 | 9.09 |",
        "| group 20 (%) | 5.26 | 0.00 | 9.09 |",
        "| group 30 (%) | 5.26 | 5.56 | 9.09 |"]


def test_mismatched_line_counts(files, tmp_path):
    short = lines(tmp_path / "short.txt", SYSTEM_A[:2])
    with pytest.raises(DataFormatError, match=r"short\.txt:3: expected one sentence per "
                                              r"reference, 3 as .*ref\.vi has, got 'end of "
                                              r"file after 2 lines'"):
        analyse(files["train"], [files["a"], short], files["ref"])
    long = lines(tmp_path / "long.txt", [*SYSTEM_A, "one more", "and another"])
    with pytest.raises(DataFormatError, match=r"long\.txt:4: expected one sentence per "
                                              r"reference.*2 more lines: 'one more'"):
        analyse(files["train"], [long], files["ref"])
    write_hypotheses(tmp_path / "two.jsonl", [0, 1], ["s", "s"], SYSTEM_A[:2], REFERENCES[:2])
    with pytest.raises(DataFormatError, match=r"two\.jsonl: expected one sentence per "
                                              r"reference, 3 as .*ref\.vi has, got '2 records'"):
        analyse(files["train"], [tmp_path / "two.jsonl"], files["ref"])
    # a .jsonl of another set: its reference on file line 2 (id 1) is not ref.vi's line 2
    write_hypotheses(tmp_path / "other.jsonl", [0, 1, 2], ["s"] * 3, SYSTEM_A,
                     [REFERENCES[0], "a cat sat", REFERENCES[2]])
    with pytest.raises(DataFormatError, match=r"other\.jsonl:2: expected the reference of "
                                              r".*ref\.vi:2 .*got 'a cat sat'"):
        analyse(files["train"], [tmp_path / "other.jsonl"], files["ref"])
    # ... or of the first .jsonl, without --references
    write_hypotheses(tmp_path / "good.jsonl", [0, 1, 2], ["s"] * 3, SYSTEM_A, REFERENCES)
    with pytest.raises(DataFormatError, match=r"other\.jsonl:2: expected the reference of "
                                              r".*good\.jsonl:2 "):
        analyse(files["train"], [tmp_path / "good.jsonl", tmp_path / "other.jsonl"])


def test_empty_missing_and_malformed_files(files, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for kwargs, match in (
            ({"train": empty}, r"empty\.txt: expected a training text .*got an empty file"),
            ({"hypotheses": [empty]}, r"empty\.txt: expected a hypothesis file .*empty file"),
            ({"references": empty}, r"empty\.txt: expected a reference file .*empty file")):
        args = {"train": files["train"], "hypotheses": [files["a"]],
                "references": files["ref"]} | kwargs
        with pytest.raises(DataFormatError, match=match):
            analyse(**args)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(DataFormatError, match=r"blank\.jsonl: expected one JSON record"):
        analyse(files["train"], [tmp_path / "blank.jsonl"], files["ref"])
    blank_train = lines(tmp_path / "blank.train", ["", " "])
    with pytest.raises(DataFormatError, match=r"blank\.train: expected at least one word"):
        analyse(blank_train, [files["a"]], files["ref"])
    blank_refs = lines(tmp_path / "blank.ref", ["", "", ""])
    with pytest.raises(ValueError, match="the references have no words"):
        analyse(files["train"], [files["a"]], blank_refs)
    missing = tmp_path / "nowhere.txt"
    for kwargs, what in (({"train": missing}, "training text"),
                         ({"hypotheses": [files["a"], missing]}, "hypothesis file"),
                         ({"references": missing}, "reference file")):
        args = {"train": files["train"], "hypotheses": [files["a"]],
                "references": files["ref"]} | kwargs
        with pytest.raises(FileNotFoundError, match=rf"{what} not found: .*nowhere\.txt"):
            analyse(**args)
    bad = tmp_path / "bad.jsonl"
    for text, match in (('{"hypothesis": "a", "reference": "b"}\n{"hypothesis": "a"\n',
                         r"bad\.jsonl:2: expected a JSON object"),
                        ('{"hypothesis": "a", "reference": "b"}\n\n{"hypothesis": 1, '
                         '"reference": "b"}\n', r"bad\.jsonl:3: expected a JSON object"),
                        ('{"id": 0, "hypothesis": "a", "reference": "b"}\n'
                         '{"id": 0, "hypothesis": "a", "reference": "b"}\n',
                         r"bad\.jsonl:2: expected each id once \(id 0 is also on line 1\)")):
        bad.write_text(text)
        with pytest.raises(DataFormatError, match=match):
            analyse(files["train"], [bad], files["ref"])
    with pytest.raises(ValueError, match="plain-text hypotheses need --references"):
        analyse(files["train"], [files["a"]])
    with pytest.raises(ValueError, match="1 names for 2 hypothesis files"):
        analyse(files["train"], [files["a"], files["b"]], files["ref"], names=["x"])


def test_cli(files, capsys):
    main(["--train", str(files["train"]), "--hypotheses", str(files["a"]), str(files["b"]),
          "--references", str(files["ref"]), "--names", "baseline", "MQT"])
    out = capsys.readouterr().out
    assert "| | reference | baseline | MQT |" in out
    assert "| deviation (%) | | -29.63 | +72.73 |" in out
    main(["--train", str(files["train"]), "--hypotheses", str(files["a"]),
          "--references", str(files["ref"]), "--json", "--groups", "1-30"])
    result = json.loads(capsys.readouterr().out)
    assert result["systems"]["a"]["deviation"] == pytest.approx(DEV_A)
    assert result["reference"]["mean_frequency"] == pytest.approx(MEAN_REF)
    assert result["train"] == str(files["train"]) and result["training_tokens"] == 54
    with pytest.raises(SystemExit, match=r"error: hypothesis file not found: .*nowhere"):
        main(["--train", str(files["train"]), "--hypotheses", "nowhere.txt",
              "--references", str(files["ref"])])
    with pytest.raises(SystemExit):
        main(["--train", str(files["train"]), "--hypotheses", str(files["a"]),
              "--groups", "one-30"])
    assert "groups: ranges like 1-30" in capsys.readouterr().err
    # as a module, in a fresh interpreter
    done = subprocess.run([sys.executable, "-m", "experiments.rare_words", "--train",
                           str(files["train"]), "--hypotheses", str(files["b"]),
                           "--references", str(files["ref"])], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| mean frequency (%) | 5.26 | 9.09 |" in done.stdout


def test_moses_option_tokenizes_a_raw_training_text(files, tmp_path):
    # raw "zebra." and "blue, red, mat." become "zebra ." and "blue , red , mat .": 12 types
    # (with "," and "."), 54 + 1 + 6 = 61 tokens.  Rarest first: zebra (1), then "," and "."
    # (2 each, "," first in code-point order), blue and red (3), ...; with n = 12 the groups
    # of ranks 1, 2, 3 are ceil(100 r / 12) = 9, 17, 25 (rank 4: 34)
    raw = tmp_path / "train.raw"
    raw.write_text(TRAIN.replace("zebra", "zebra.") + "blue, red, mat.\n", encoding="utf-8")
    result = analyse(raw, [files["a"]], files["ref"], moses="en")
    assert (result["vocabulary"], result["training_tokens"]) == (12, 61)
    assert result["groups"] == [9, 17, 25]
    # the reference's only word of these groups is zebra (line 3): 100/19 per group 9
    assert result["reference"]["frequencies"] == pytest.approx([100 / 19, 0, 0])
