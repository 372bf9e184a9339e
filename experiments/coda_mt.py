"""CoDA in the Transformer for machine translation (Tay et al. 2019, Sec. 3.4 and 4):
IWSLT'15 English-Vietnamese, Transformer vs CoDA Transformer (Table 4), the NMT column of the
centering ablation (Table 8) and the composition functions (Table 9), BLEU on the Stanford
release's tokenized references (the paper's tensor2tensor setting; lit_models/bleu.py).

    python experiments/coda_mt.py fit --config experiments/configs/coda_mt/smoke.yaml
    python experiments/coda_mt.py grid table4 --config paper --seeds 1
    python experiments/coda_mt.py report table4
    python experiments/coda_mt.py grid table4 --config small     # docs/results/coda.md's CPU run
    python experiments/coda_mt.py grid table4_chosen --config small --jobs 2  # + MLU's choice

The paper ran tensor2tensor's ``transformer_base_single_gpu`` for 50K steps and averaged the
last checkpoints (``avg_checkpoints.py``: the last 20 by default); configs/coda_mt/paper.yaml
is that recipe.  Table 4 reports test BLEU (tst2013); Tables 8 and 9 development BLEU
(tst2012), read here as the last validation BLEU of the run.
"""

from experiments.coda_mlu import with_chosen_coda
from experiments.coda_nli import CENTERING, TABLE9_BLEU
from experiments.harness.grid_model import Cell, Experiment, Grid
from experiments.harness.slice_model import TRANSLATION_SLICES
from lit_models.mt_rows import LINKS

CODA = ["--model.attention=coda"]
# Table 8, NMT column (IWSLT'15 dev BLEU): no centering, E centered, E and N centered
TABLE8_BLEU = {"none": 27.8, "e": 26.9, "e_n": 27.3}
BLEU_NOTE = ("BLEU: tokenized (sacreBLEU tok:none, as multi-bleu.perl) on the Stanford "
             "release's tokenized references; test/sacrebleu in the CSV is the detokenized "
             "13a score, both signatures in the run's hparams.yaml and bleu-test.json.")
TABLE4 = Grid(
    name="table4",
    claims=[("transformer", "coda")],
    title="CoDA Table 4: IWSLT'15 En-Vi, test BLEU (tst2013)",
    metrics={"BLEU": "test/bleu"},
    scale=1.0,
    curve="val/bleu",
    cells=[Cell("transformer", ["--model.attention=softmax"], {"BLEU": 28.43}),
           Cell("coda", CODA, {"BLEU": 29.84})],
    note="Paper: tensor2tensor transformer_base_single_gpu, 50K steps, checkpoint "
         "averaging, one TitanX. " + BLEU_NOTE,
)

EXPERIMENT = Experiment(
    name="coda_mt",
    slices=TRANSLATION_SLICES,
    model_class="lit_models.transformer.TransformerSeq2Seq",
    datamodule_class="datamodules.iwslt.IWSLT15DataModule",
    links=LINKS,
    grids={
        "table4": TABLE4,
        # Table 4 with the CoDA setting the MLU decoder study chose (coda_mlu.CHOSEN_CODA):
        # does translation move the way MLU does?
        "table4_chosen": with_chosen_coda(
            TABLE4,
            title="CoDA Table 4 with the MLU decoder study's CoDA setting: IWSLT'15 En-Vi, "
                  "test BLEU",
            note="Chosen on MLU, not on translation. " + TABLE4.note),
        "table8": Grid(
            name="table8",
            title="CoDA Table 8, NMT column: centering of E and N, IWSLT'15 dev BLEU (tst2012)",
            metrics={"Dev BLEU": "val/bleu"},
            scale=1.0,
            cells=[Cell(f"coda-{center}", CODA + args, {"Dev BLEU": TABLE8_BLEU[center]})
                   for center, args in CENTERING.items()],
            note="Centering 'e': E <- E - mean(E) (Eq. 6); 'e_n': also N <- N - mean(N) "
                 "(Eq. 4). Ours: the last validation BLEU of the run. " + BLEU_NOTE,
        ),
        "table9": Grid(
            name="table9",
            title="CoDA Table 9: composition functions F_E(E) * F_N(N), IWSLT'15 dev BLEU "
                  "(tst2012)",
            metrics={"Dev BLEU": "val/bleu"},
            scale=1.0,
            cells=[Cell(f"{e}-{n}", CODA + [f"--model.attention.e_fn={e}",
                                            f"--model.attention.n_fn={n}"],
                        {"Dev BLEU": bleu})
                   for (e, n), bleu in TABLE9_BLEU.items()],
            note="Ours: the last validation BLEU of the run. " + BLEU_NOTE,
        ),
    },
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
