"""Differentiable Window attention in the Transformer for machine translation (Nguyen et al.
2020, Sec. 5.1-5.2; docs/papers.md): WMT'14 En-De and En-Fr with the window in the
encoder, the decoder and the cross-attention (Table 1), full vs partial layers (Table 2),
token vs segment masking (Table 3), and parameters and training speed (Table 4).

    python experiments/dwin_mt.py fit --config experiments/configs/dwin_mt/smoke.yaml \\
        --config experiments/configs/dwin_mt/smoke/en_de.yaml
    python experiments/dwin_mt.py grid table1 --config paper
    python experiments/dwin_mt.py report table1

Each language pair is a config of its own merged after the grid config
(``configs/dwin_mt/<config>/{en_de,en_fr}.yaml``).  The paper's setting (configs/dwin_mt/
paper.yaml): fairseq's Transformer base (post-norm, 6+6 layers, 512/2048, 8 heads, shared
BPE vocabulary and embeddings), 200K (En-De) / 150K (En-Fr) updates, the last 5 checkpoints
averaged, beam 4; BLEU tokenized and case-sensitive, with compound splitting for En-De.

The placement of Sec. 4.3: encoder self-attention AW, decoder self-attention MW
(token-based: the decoder cannot point to unfinished segments), cross-attention AW with
segments of 5 words; "partial" = in the first 3 of 6 layers (softmax above), the setting of
Tables 1, 3 and 4.
"""

from experiments.harness.grid_model import Cell, Experiment, Grid, cost_grid, dataset_config
from experiments.harness.slice_model import TRANSLATION_SLICES
from lit_models.mt_rows import (
    COST_ROWS,
    CR_AW_SEG,
    DEC_MW,
    ENC_AW,
    LINKS,
    PARTIAL,
    SEGMENT,
    TABLE1_ROWS,
)

TABLE1 = {"en_de": [27.46, 27.56, 27.62, 28.11, 28.13, 28.25],
          "en_fr": [39.21, 39.37, 39.47, 40.24, 40.06, 40.32]}
# Table 2: method x module, full (6 layers) / partial (first 3), En-De
MODULE_FLAG = {"encoder": "encoder_attention", "decoder": "decoder_attention",
               "cross": "cross_attention"}
TABLE2 = {("aw", "encoder"): (27.77, 27.90), ("mw", "encoder"): (27.25, 27.40),
          ("aw", "decoder"): (27.73, 27.85), ("mw", "decoder"): (27.88, 28.04),
          ("aw", "cross"): (27.78, 27.97), ("mw", "cross"): (27.58, 27.79)}
# Table 4: parameters (M), steps/s and BLEU, En-De
TABLE4 = {
    "transformer": ([], 63, 1.20, 27.46),
    "localness": (TABLE1_ROWS["localness"], 63, 1.07, 27.62),
    "transformer_7_layers": (["--model.n_encoder_layers=7", "--model.n_decoder_layers=7"],
                             69, 1.05, 27.74),
    "transformer_8_layers": (["--model.n_encoder_layers=8", "--model.n_decoder_layers=8"],
                             75, 0.99, 27.89),
    "enc_aw-cr_aw_seg-dec_mw": (TABLE1_ROWS["enc_aw-cr_aw_seg-dec_mw"], 73, 1.04, 28.25),
}
BLEU_NOTE = ("BLEU: tokenized, case-sensitive, with compound splitting for En-De (sacreBLEU "
             "tok:none on the Moses-tokenized references, after tensor2tensor's "
             "get_ende_bleu.sh); test/sacrebleu in the CSV is sacreBLEU's detokenized 13a "
             "score, both signatures in the run's hparams.yaml and bleu-test.json.")


def window_module(method: str, module: str) -> list[str]:
    flag = f"--model.{MODULE_FLAG[module]}"
    seg = [f"{flag}.segment_size={SEGMENT}"] if module == "cross" and method == "aw" else []
    return [f"{flag}=window", f"{flag}.variant={method}"] + seg


EXPERIMENT = Experiment(
    name="dwin_mt",
    slices=TRANSLATION_SLICES,
    model_class="lit_models.transformer.TransformerSeq2Seq",
    datamodule_class="datamodules.translation.TranslationDataModule",
    # the dataset configs' DataModules, also by class name (--data.help CLASS)
    subclasses=["datamodules.wmt.WMT14DataModule"],
    subclass_mode_data=True,
    links=LINKS,
    grids={
        "table1": Grid(
            name="table1",
            claims=[(f"{pair}-{baseline}", f"{pair}-{row}") for pair in TABLE1
                    for baseline, row in (("transformer", "enc_aw-dec_mw"),
                                          ("transformer", "cr_aw_seg"),
                                          ("transformer", "enc_aw-cr_aw_seg-dec_mw"),
                                          ("localness", "enc_aw-cr_aw_seg-dec_mw"))],
            title="Differentiable Window Table 1: WMT'14 En-De and En-Fr, test BLEU "
                  "(newstest2014)",
            metrics={"BLEU": "test/bleu"},
            scale=1.0,
            cells=[Cell(f"{pair}-{row}", dataset_config(pair) + args, {"BLEU": paper[i]})
                   for pair, paper in TABLE1.items()
                   for i, (row, args) in enumerate(TABLE1_ROWS.items())],
            note="Window rows: the first 3 of 6 layers (Sec. 4.3); Cr(AW,Seg) with segments "
                 f"of {SEGMENT}. " + BLEU_NOTE,
        ),
        "table2": Grid(
            name="table2",
            claims=[("transformer", f"{method}-{module}-{extent}") for method, module in TABLE2
                    for extent in ("full", "partial")],
            title="Differentiable Window Table 2: AW / MW in one module, all 6 layers (full) "
                  "vs the first 3 (partial), WMT'14 En-De test BLEU",
            metrics={"BLEU": "test/bleu"},
            scale=1.0,
            cells=[Cell("transformer", dataset_config("en_de"), {"BLEU": 27.46})] + [
                Cell(f"{method}-{module}-{extent}",
                     dataset_config("en_de") + window_module(method, module)
                     + (PARTIAL if extent == "partial" else []),
                     {"BLEU": paper[extent == "partial"]})
                for (method, module), paper in TABLE2.items()
                for extent in ("full", "partial")],
            note=f"Cross-attention AW with segments of {SEGMENT}, as Table 1; the other "
                 "modules token-based. " + BLEU_NOTE,
        ),
        "table3": Grid(
            name="table3",
            claims=[("cr_aw-token", "cr_aw-segment"), ("enc_aw-dec_mw-token",
                                                       "enc_aw-dec_mw-segment")],
            title="Differentiable Window Table 3: token- vs segment-based masking, WMT'14 "
                  "En-De test BLEU",
            metrics={"BLEU": "test/bleu"},
            scale=1.0,
            cells=[
                Cell("cr_aw-token", dataset_config("en_de") + CR_AW_SEG[:2] + PARTIAL,
                     {"BLEU": 27.97}),
                Cell("cr_aw-segment", dataset_config("en_de") + CR_AW_SEG + PARTIAL,
                     {"BLEU": 28.13}),
                Cell("enc_aw-dec_mw-token", dataset_config("en_de") + ENC_AW + DEC_MW + PARTIAL,
                     {"BLEU": 28.11}),
                Cell("enc_aw-dec_mw-segment", dataset_config("en_de") + ENC_AW + DEC_MW
                     + [f"--model.encoder_attention.segment_size={SEGMENT}"] + PARTIAL,
                     {"BLEU": 27.91}),
            ],
            note="The decoder's self-attention is token-based in every row (it cannot point "
                 f"to unfinished segments); segments of {SEGMENT}. " + BLEU_NOTE,
        ),
        "table4": Grid(
            name="table4",
            claims=[("transformer", "enc_aw-cr_aw_seg-dec_mw"),
                    ("transformer_8_layers", "enc_aw-cr_aw_seg-dec_mw")],
            title="Differentiable Window Table 4: size and training speed, WMT'14 En-De",
            metrics={"Params (M)": "hparams/n_parameters",
                     "Steps/s": "train/steps_per_second", "BLEU": "test/bleu"},
            scale=1.0,
            scales={"Params (M)": 1e-6},
            relative_to={"Steps/s": "transformer"},
            cells=[Cell(name, dataset_config("en_de") + args,
                        {"Params (M)": params, "Steps/s": speed, "BLEU": bleu})
                   for name, (args, params, speed, bleu) in TABLE4.items()],
            note="Steps/s: optimiser steps per second of training-step time (forward, "
                 "backward, update; data loading and validation excluded; "
                 "lit_models/base.py), on this machine: compare the ratios to the "
                 "Transformer row (paper: ours at 1.04 / 1.20 = 0.87x), not the values "
                 "(the paper's are on GPUs). " + BLEU_NOTE,
        ),
        "cost": cost_grid(
            "Training cost of the translation model per mechanism, WMT'14 En-De (DW Table 4's "
            "measure)", "transformer",
            [Cell(name, dataset_config("en_de") + args) for name, args in COST_ROWS.items()],
            note="Rows: relative in both self-attentions (all layers); localness, MW and AW "
                 "in the encoder's lower 3 layers (as Table 1 places them); the paper's "
                 "Enc(AW)-Cr(AW,Seg)-Dec(MW); CoDA in every attention module (CoDA Table 4). "
                 "Goal (issue 18): 0.87x of the Transformer's steps/s or better (the paper's "
                 "window model: 1.04 / 1.20). Use --config speed, one run at a time."),
    },
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
