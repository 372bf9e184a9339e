"""CoDA on natural language inference (Tay et al. 2019, Sec. 3.3 and 4; docs/papers.md#coda):
DecompAtt with softmax alignment vs. CoDA's quasi-attention on SNLI, MultiNLI, SciTail
and Dialogue NLI (Table 3), the centering ablation (Table 8) and the composition functions
(Table 9, on SNLI).

Each dataset is a table column: its DataModule and settings are a config of their own,
merged after the grid config (``configs/coda_nli/<config>/{snli,mnli,scitail,dnli}.yaml``),
which holds the trainer and the model only.  The smoke dataset configs read small real
files of ../shared/data (the SNLI dev prefix, the MultiNLI and SciTail samples) or the
synthetic Dialogue NLI files of tests/fixtures, so every grid runs with ``--smoke`` alone.

    python experiments/coda_nli.py fit --config experiments/configs/coda_nli/smoke.yaml \\
        --config experiments/configs/coda_nli/smoke/snli.yaml --model.attention coda
    python experiments/coda_nli.py fit --config experiments/configs/coda_nli/paper.yaml \\
        --config experiments/configs/coda_nli/paper/scitail.yaml --model.attention coda
    python experiments/coda_nli.py grid table3 --smoke
    python experiments/coda_nli.py report table3 --smoke
"""

from experiments.harness.grid_model import Cell, Experiment, Grid, dataset_config
from experiments.harness.slice_model import NLI_SLICES

LINKS = [("vocab_size", "vocab_size"), ("num_classes", "num_classes"), ("pad_id", "pad_id"),
         ("embeddings", "embeddings")]


CODA = ["--model.attention=coda"]
# Table 3 (test accuracy); MNLI: matched / mismatched
TABLE3 = {"snli": ({"Acc": 84.61}, {"Acc": 85.71}),
          "mnli": ({"Acc": 71.34, "MNLI mm": 71.97}, {"Acc": 72.19, "MNLI mm": 72.45}),
          "scitail": ({"Acc": 82.0}, {"Acc": 83.6}),
          "dnli": ({"Acc": 88.2}, {"Acc": 88.8})}
# Table 8 (development accuracy): no centering, E centered (Eq. 6), E and N centered (Eq. 4)
CENTERING = {"none": [], "e": ["--model.attention.center_e=true"],
             "e_n": ["--model.attention.center_e=true", "--model.attention.gate=centered"]}
TABLE8 = {"scitail": {"none": 85.3, "e": 84.5, "e_n": 85.0},
          "dnli": {"none": 86.5, "e": 86.8, "e_n": 86.7}}
# Table 9 (IWSLT'15 dev BLEU only): F_E x F_N
TABLE9_BLEU = {("tanh", "sigmoid"): 27.8, ("tanh", "tanh"): 23.1, ("tanh", "arctan"): 21.9,
               ("tanh", "algebraic"): 26.1, ("sigmoid", "tanh"): 21.9,
               ("sigmoid", "sigmoid"): 27.5, ("sigmoid", "arctan"): 25.1,
               ("sigmoid", "algebraic"): 26.3}

EXPERIMENT = Experiment(
    name="coda_nli",
    slices=NLI_SLICES,
    model_class="lit_models.decomp_att.DecompAtt",
    datamodule_class="datamodules.nli.NLIDataModule",
    subclass_mode_data=True,
    links=LINKS,
    grids={
        "table3": Grid(
            name="table3",
            claims=[(f"{name}-softmax", f"{name}-coda") for name in TABLE3],
            title="CoDA Table 3: DecompAtt vs. DecompAtt + CoDA, NLI test accuracy (%)",
            metrics={"Acc": "test/acc", "MNLI mm": "test/acc_mismatched"},
            cells=[Cell(f"{name}-{mech}",
                        dataset_config(name) + ([] if mech == "softmax" else CODA), paper[i])
                   for name, paper in TABLE3.items()
                   for i, mech in enumerate(("softmax", "coda"))],
            note="MNLI: 'Acc' is dev matched, 'MNLI mm' dev mismatched (the test sets are "
                 "unlabelled). Paper: 50 epochs, Adam 3e-4, hidden 200, batch 64 (32 for "
                 "SciTail); CoDA with tanh(E) * sigmoid(N), no centering.",
        ),
        "table8": Grid(
            name="table8",
            title="CoDA Table 8: centering of E and N, development accuracy (%)",
            metrics={"Dev acc": "val/acc_best"},
            cells=[Cell(f"{name}-{center}", dataset_config(name) + CODA + args,
                        {"Dev acc": TABLE8[name][center]})
                   for name in TABLE8 for center, args in CENTERING.items()],
            note="Centering 'e': E <- E - mean(E) (Eq. 6); 'e_n': also N <- N - mean(N) "
                 "(Eq. 4). The paper's NMT and WikiQA columns belong to other experiments. "
                 "Ours: the best validation accuracy of the run.",
        ),
        "table9": Grid(
            name="table9",
            title="CoDA Table 9 on SNLI: composition functions F_E(E) * F_N(N), development "
                  "accuracy (%)",
            metrics={"Dev acc": "val/acc_best"},
            cells=[Cell(f"{e}-{n}", dataset_config("snli") + CODA
                        + [f"--model.attention.e_fn={e}", f"--model.attention.n_fn={n}"],
                        {"Dev acc": None})
                   for e, n in TABLE9_BLEU],
            note="The paper ran this ablation on IWSLT'15 En-Vi only (dev BLEU: "
                 + ", ".join(f"{e}*{n} {b}" for (e, n), b in TABLE9_BLEU.items())
                 + "); there are no NLI numbers to compare with.",
        ),
    },
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
