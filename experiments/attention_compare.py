"""Which attention for my task? (issue 45) Every attention mechanism of the four papers that
serves a Transformer's multi-head attention, on one recipe: the classifier of Differentiable
Window Table 5 (tensor2tensor's tiny Transformer: 2 layers, 4 heads, 128 hidden, 512
feed-forward; t2t's optimiser; BPE), the mechanism under test in every encoder layer, 3,000
updates, on SST and on IMDb (grids ``sst`` and ``imdb``), each mechanism against softmax.

The cells are the registry's: one per mechanism that serves the multihead context
(``attention.registry.supporting("multihead")``, read here from the source without importing
torch: ``experiments.harness.sources.mechanisms_supporting``) with its paper defaults, the window's
two variants as two cells, and CoDA with the MLU decoder study's beta 0.25
(lit_models/compare_rows.py).  A mechanism registered later becomes a cell by itself; one
that cannot serve multi-head attention is no cell (asked for by hand, the registry refuses it
in one line).  No paper reports these numbers: each comparison with softmax is the suite's
own (no paper number), tested by ``report`` as the papers' claims are.

Cost: the cells' training steps/s relative to softmax, parameters and tensor memory of a
training step, measured with the models taking turns step by step in one process on the same
batches (benchmarks/model_cost.py; the timings of runs on a loaded machine are not
comparable), one JSONL per dataset under results/attention_compare_cost/ that ``report``
prints and ``report --plot`` draws against the accuracy differences.

    python experiments/attention_compare.py grid sst --smoke --cells sst-softmax sst-coda
    python experiments/attention_compare.py report sst --smoke
    python experiments/attention_compare.py grid sst --config paper --seeds 3 --jobs 2 --threads 1
    python -m benchmarks.model_cost --model compare --data sst --threads 1 --rounds 2 \\
        --steps 20 --warmup 3 --out results/attention_compare_cost/sst.jsonl
    python experiments/attention_compare.py report sst --plot
"""

from experiments.harness.grid_model import Cell, Experiment, Grid, dataset_config
from experiments.harness.slice_model import SENTIMENT_SLICES
from experiments.harness.sources import mechanisms_supporting
from lit_models.compare_rows import LINKS, mechanism_rows

#: row -> flags: every mechanism serving multi-head attention, then CoDA with beta 0.25
ROWS = mechanism_rows(mechanisms_supporting("multihead"))
BASELINE = "softmax"
DATASETS = {"sst": "SST (binary sentences, trained on the training trees' phrases)",
            "imdb": "IMDb (the complete aclImdb, 25,000 test reviews)"}
COST_FILE = "results/attention_compare_cost/{data}.jsonl"


def compare_grid(data: str) -> Grid:
    """Grid ``data``: one cell per row on that dataset, each row's comparison with softmax."""
    cost_file = COST_FILE.format(data=data)
    return Grid(
        name=data,
        title=f"Which attention? {DATASETS[data]}: every mechanism in every layer of DW "
              "Table 5's classifier, 3,000 updates, test accuracy (%)",
        metrics={"Acc": "test/acc"},
        cells=[Cell(f"{data}-{row}", dataset_config(data) + flags) for row, flags in ROWS.items()],
        claims=[(f"{data}-{BASELINE}", f"{data}-{row}") for row in ROWS if row != BASELINE],
        cost_file=cost_file,
        note="No paper number: every comparison is the suite's own (each mechanism against "
             "softmax on the same model, data, seeds and budget). One recipe for every cell, "
             "Differentiable Window Table 5's (t2t tiny, its optimiser, BPE), with the "
             "mechanism in every encoder layer: the window's own Table 5 places it in layer 1 "
             "only and localness's paper in the lower layers, relative positions' paper in "
             "every layer, as here; 3,000 updates sit inside t2t's 8,000-step warm-up, which "
             "favours mechanisms that learn fast at a small learning rate. Each mechanism "
             "with its class defaults (its paper's); coda-beta0.25: the CoDA gate bias the MLU "
             "decoder study chose for a decoder (experiments/coda_mlu.py). Nothing tuned per "
             "mechanism. Interleaved cost: python -m benchmarks.model_cost --model compare "
             f"--data {data} --threads 1 --rounds 2 --steps 20 --warmup 3 --out {cost_file}.",
    )


EXPERIMENT = Experiment(
    name="attention_compare",
    slices=SENTIMENT_SLICES,
    model_class="lit_models.transformer.TransformerClassifier",
    datamodule_class="datamodules.text.TextClassificationDataModule",
    # the dataset configs' DataModules, also by class name (--data.help SSTDataModule)
    subclasses=["datamodules.imdb.IMDbDataModule", "datamodules.sst.SSTDataModule"],
    subclass_mode_data=True,
    links=LINKS,
    grids={data: compare_grid(data) for data in DATASETS},
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
