"""Quantum statistics-inspired attention (docs/papers.md): the attention density matrix
(MQT, AQT) in an LSTM seq2seq translator against additive (Bahdanau) and structured (Kim et
al. 2017) attention, Table 1: IWSLT'15 En-Vi and WMT'16 En-Ro in both directions, dev and
test BLEU.

    python experiments/qadm_mt.py fit --config experiments/configs/qadm_mt/smoke.yaml \\
        --config experiments/configs/qadm_mt/smoke/en_vi.yaml --model.attention density
    python experiments/qadm_mt.py grid table1 --config paper
    python experiments/qadm_mt.py report table1

Each direction is a config of its own merged after the grid config
(``configs/qadm_mt/<config>/{en_vi,vi_en,en_ro,ro_en}.yaml``).  Table 4 (rare words) is a
command on the decoded test files every run writes (``hypotheses-test.jsonl``):

    python -m experiments.rare_words --train <train file of the target language> \\
        --hypotheses runs/qadm_mt/table1-paper/en_vi-{additive,mqt}-seed0/hypotheses-test.jsonl
"""

from experiments.harness.grid_model import Cell, Experiment, Grid, dataset_config
from experiments.harness.slice_model import TRANSLATION_SLICES
from lit_models.mt_rows import LINKS

MECHANISMS = {"additive": ["--model.attention=additive"],
              "structured": ["--model.attention=structured"],
              "mqt": ["--model.attention=density", "--model.attention.scheme=mqt"],
              "aqt": ["--model.attention=density", "--model.attention.scheme=aqt"]}
# Table 1: dev / test BLEU per direction and attention
TABLE1 = {
    "en_vi": {"additive": (22.90, 24.11), "structured": (16.81, 17.00),
              "mqt": (23.41, 25.34), "aqt": (22.71, 24.34)},
    "vi_en": {"additive": (19.14, 20.76), "structured": (17.19, 18.08),
              "mqt": (20.65, 22.23), "aqt": (19.95, 21.33)},
    "en_ro": {"additive": (13.65, 15.31), "structured": (7.04, 7.03),
              "mqt": (15.01, 16.95), "aqt": (3.98, 4.56)},
    "ro_en": {"additive": (17.15, 16.74), "structured": (11.02, 11.08),
              "mqt": (19.03, 19.09), "aqt": (5.08, 5.62)},
}

EXPERIMENT = Experiment(
    name="qadm_mt",
    slices=TRANSLATION_SLICES,
    model_class="lit_models.rnn_seq2seq.RNNSeq2Seq",
    datamodule_class="datamodules.translation.TranslationDataModule",
    # the dataset configs' DataModules, also by class name (--data.help CLASS)
    subclasses=["datamodules.iwslt.IWSLT15DataModule", "datamodules.wmt.WMT16EnRoDataModule"],
    subclass_mode_data=True,
    links=LINKS,
    grids={
        "table1": Grid(
            name="table1",
            claims=[(f"{pair}-{baseline}", f"{pair}-{density}") for pair in TABLE1
                    for baseline, density in (("additive", "mqt"), ("additive", "aqt"),
                                              ("structured", "mqt"))],
            title="Attention density matrix Table 1: LSTM seq2seq, dev / test BLEU",
            metrics={"Dev BLEU": "val/bleu", "Test BLEU": "test/bleu"},
            scale=1.0,
            curve="val/bleu",
            cells=[Cell(f"{pair}-{name}", dataset_config(pair) + MECHANISMS[name],
                        {"Dev BLEU": dev, "Test BLEU": test})
                   for pair, rows in TABLE1.items() for name, (dev, test) in rows.items()],
            note="IWSLT'15: tst2012 dev, tst2013 test, the Stanford word vocabularies; "
                 "WMT'16 En-Ro: newsdev2016 dev, newstest2016 test, joint BPE of 32K merges. "
                 "BLEU tokenized (sacreBLEU tok:none, as multi-bleu.perl; the paper does not "
                 "say which BLEU); dev: the last validation of the run. Beam 10, at most 50 "
                 "tokens.",
        ),
    },
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
