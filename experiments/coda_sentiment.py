"""CoDA Table 5: sentiment analysis on IMDb and SST, Transformer vs CoDA Transformer (Tay et
al. 2019, Sec. 3.5): tensor2tensor's tiny Transformer, byte-pair encoding, 2000 steps.

Each dataset is a table column: its DataModule and settings are a config of their own,
merged after the grid config (``configs/coda_sentiment/<config>/{imdb,sst}.yaml``), which
holds the trainer and the model only.  The smoke dataset configs read the shared GLUE SST-2
copy (../shared/data/sst2_glue) or the synthetic aclImdb folder of tests/fixtures, so the
grid runs with ``--smoke`` alone.

    python experiments/coda_sentiment.py fit \\
        --config experiments/configs/coda_sentiment/smoke.yaml \\
        --config experiments/configs/coda_sentiment/smoke/sst.yaml --model.attention coda
    python experiments/coda_sentiment.py grid table5 --smoke
    python experiments/coda_sentiment.py grid table5 --config paper --seeds 3
    python experiments/coda_sentiment.py report table5
"""

from experiments.harness.grid_model import Cell, Experiment, Grid, dataset_config
from experiments.harness.slice_model import SENTIMENT_SLICES

PAPER = {("imdb", "softmax"): 82.6, ("imdb", "coda"): 83.3,
         ("sst", "softmax"): 78.9, ("sst", "coda"): 80.6}
ROWS = {"softmax": "transformer", "coda": "coda"}

EXPERIMENT = Experiment(
    name="coda_sentiment",
    slices=SENTIMENT_SLICES,
    model_class="lit_models.transformer.TransformerClassifier",
    datamodule_class="datamodules.text.TextClassificationDataModule",
    # the dataset configs' DataModules, also by class name (--data.help SSTDataModule)
    subclasses=["datamodules.imdb.IMDbDataModule", "datamodules.sst.SSTDataModule"],
    subclass_mode_data=True,
    links=[("vocab_size", "vocab_size"), ("pad_id", "pad_id"), ("num_classes", "num_classes")],
    grids={
        "table5": Grid(
            name="table5",
            claims=[(f"{data}-transformer", f"{data}-coda") for data in ("imdb", "sst")],
            title="CoDA Table 5: sentiment analysis, test accuracy (%)",
            metrics={"Acc": "test/acc"},
            cells=[Cell(f"{data}-{ROWS[attention]}",
                        dataset_config(data) + [f"--model.attention={attention}"],
                        {"Acc": number})
                   for (data, attention), number in PAPER.items()],
            note="Paper: tensor2tensor, transformer_tiny, problems sentiment_imdb (8K subwords, "
                 "scored on the 25K test reviews) and sentiment_sst_binary (GLUE SST-2: 16K "
                 "subwords, trained on the 67K phrases, scored on the 872 dev sentences); "
                 "2000 steps. Ours: HF tokenizers BPE of the same sizes; see the configs for "
                 "the remaining differences.",
        ),
    },
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
