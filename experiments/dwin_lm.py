"""Differentiable Window Table 6: language modelling on the One Billion Word benchmark with
the window in a decoder-only Transformer (Nguyen et al. 2020, Sec. 5.4): the MT model's
base size, 100K updates, perplexity on the held-out data (lower is better).

    python experiments/dwin_lm.py fit --config experiments/configs/dwin_lm/smoke.yaml
    python experiments/dwin_lm.py fit --config experiments/configs/dwin_lm/paper.yaml \\
        --data.data_dir /path/to/1-billion-word-language-modeling-benchmark-r13output
    python experiments/dwin_lm.py grid table6 --config paper
    python experiments/dwin_lm.py report table6

One dataset, so its DataModule and settings stay in the grid configs (no dataset configs).
The smoke config reads a small SYNTHETIC folder in the benchmark's layout
(tests/fixtures/lm1b).  The paper config reads the folder ``--data.data_dir`` names, else
../shared/data/1-billion-word-language-modeling-benchmark-r13output where it exists, else
the official archive, which ``prepare_data`` downloads to the cache.
"""

from experiments.harness.grid_model import Cell, Experiment, Grid

EXPERIMENT = Experiment(
    name="dwin_lm",
    model_class="lit_models.transformer.TransformerLM",
    datamodule_class="datamodules.lm1b.LM1BDataModule",
    links=[("vocab_size", "vocab_size"), ("pad_id", "pad_id")],
    grids={
        "table6": Grid(
            name="table6",
            claims=[("softmax", "window-mw"), ("softmax", "window-aw"), ("relative", "window-aw")],
            title="Differentiable Window Table 6: One Billion Word, test perplexity",
            metrics={"PPL": "test/perplexity"},
            scale=1.0,  # perplexity is logged in its own units
            goal="minimize",
            cells=[
                Cell("softmax", ["--model.attention=softmax"], {"PPL": 46.37}),
                # Shaw et al. 2018 use relative positions in every layer
                Cell("relative", ["--model.attention=relative", "--model.attention_layers=null"],
                     {"PPL": 46.13}),
                Cell("window-mw", ["--model.attention=window", "--model.attention.variant=mw"],
                     {"PPL": 44.00}),
                Cell("window-aw", ["--model.attention=window", "--model.attention.variant=aw"],
                     {"PPL": 44.95}),
            ],
            note="Rows: softmax = Vaswani et al. (2017), relative = Shaw et al. (2018), "
                 "window-mw = Dec (MW), window-aw = Dec (AW); Yang et al.'s localness is not "
                 "applicable to a decoder-only model (the paper). Paper: Transformer base "
                 "decoder, 100K updates of about 4 x 4096 tokens (gradient aggregation), "
                 "held-out data as the test set; the window, as in its MT experiments, in the "
                 "lowest 3 of 6 layers (token-based: a decoder cannot point to unfinished "
                 "segments).",
        ),
    },
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
