"""CoDA on text-to-code generation (Tay et al. 2019, Table 7): AlgoLisp (Polosukhin and
Skidanov 2018, metaset3), a description of a problem to its Lisp-like program, exact match
per program, Transformer vs CoDA Transformer (tensor2tensor's tiny setting, 100K steps).

    python experiments/coda_text2code.py fit --config experiments/configs/coda_text2code/smoke.yaml
    python experiments/coda_text2code.py grid table7 --config paper
    python experiments/coda_text2code.py report table7
"""

from experiments.harness.grid_model import Cell, Experiment, Grid
from lit_models.mt_rows import LINKS

EXPERIMENT = Experiment(
    name="coda_text2code",
    model_class="lit_models.transformer.TransformerSeq2Seq",
    datamodule_class="datamodules.algolisp.AlgoLispDataModule",
    links=LINKS,
    grids={
        "table7": Grid(
            name="table7",
            claims=[("transformer", "coda")],
            title="CoDA Table 7: AlgoLisp text to code, exact match per program (%)",
            metrics={"Acc": "test/exact_match"},
            curve="val/exact_match",
            cells=[Cell("transformer", ["--model.attention=softmax"], {"Acc": 96.8}),
                   Cell("coda", ["--model.attention=coda"], {"Acc": 97.7})],
            note="Paper: tensor2tensor's tiny Transformer, 100K steps (the t2t program_search "
                 "problem). Exact match: the whole program, token for token, and its end.",
        ),
    },
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
