"""CoDA on answer selection and response selection (Tay et al. 2019, Sec. 3.2, Table 2;
docs/papers.md#coda): DecompAtt trained pointwise with a binary softmax loss, softmax
alignment vs. CoDA's quasi-attention, ranked by log p(relevant) within each question or
dialogue context: MAP / MRR on TrecQA and WikiQA, R10@1 ("top-1 accuracy") on the Ubuntu
Dialogue Corpus v2.  Grid ``table8`` is the WikiQA column of the centering ablation.

Each dataset is a config of its own, merged after the grid config
(``configs/coda_ranking/<config>/{trecqa,wikiqa,udc}.yaml``).  The smoke dataset configs read
the shared WikiQA and TrecQA files and the Ubuntu samples, so every grid runs with
``--smoke`` alone.  ``cpu`` is the real WikiQA run of docs/results/coda.md (filtered train, the
filtered dev set for validation and test: the shared data has no WikiQA test set).

    python experiments/coda_ranking.py fit --config experiments/configs/coda_ranking/smoke.yaml \\
        --config experiments/configs/coda_ranking/smoke/wikiqa.yaml --model.attention coda
    python experiments/coda_ranking.py grid table2 --smoke
    python experiments/coda_ranking.py grid table2 --config cpu \\
        --cells wikiqa-softmax wikiqa-coda --seeds 3
    python experiments/coda_ranking.py report table2 --config cpu
"""

from experiments.coda_nli import CENTERING, CODA, LINKS
from experiments.harness.grid_model import Cell, Experiment, Grid, dataset_config
from experiments.harness.slice_model import RANKING_SLICES

# Table 2 (test): MAP / MRR for TrecQA and WikiQA, top-1 accuracy (R10@1) for UDC
TABLE2 = {"trecqa": ({"MAP": 80.6, "MRR": 83.9}, {"MAP": 80.0, "MRR": 84.5}),
          "wikiqa": ({"MAP": 66.4, "MRR": 68.0}, {"MAP": 70.5, "MRR": 72.4}),
          "udc": ({"R10@1": 51.8}, {"R10@1": 52.5})}
# Table 8, WikiQA column (development MAP / MRR): no centering, E centered, E and N centered
TABLE8 = {"none": {"MAP": 70.4, "MRR": 71.2}, "e": {"MAP": 68.1, "MRR": 68.3},
          "e_n": {"MAP": 69.3, "MRR": 70.2}}

EXPERIMENT = Experiment(
    name="coda_ranking",
    slices=RANKING_SLICES,
    model_class="lit_models.decomp_att.DecompAtt",
    datamodule_class="datamodules.nli.NLIDataModule",
    # the dataset configs' DataModules, also by class name (--data.help CLASS)
    subclasses=["datamodules.ranking.TrecQADataModule",
                "datamodules.ranking.UbuntuDataModule",
                "datamodules.ranking.WikiQADataModule"],
    subclass_mode_data=True,
    links=LINKS,
    grids={
        "table2": Grid(
            name="table2",
            claims=[(f"{name}-softmax", f"{name}-coda") for name in TABLE2],
            title="CoDA Table 2: DecompAtt vs. DecompAtt + CoDA on answer and response "
                  "selection (MAP / MRR, R10@1, %)",
            metrics={"MAP": "test/map", "MRR": "test/mrr", "R10@1": "test/p@1"},
            cells=[Cell(f"{name}-{mech}",
                        dataset_config(name) + ([] if mech == "softmax" else CODA), paper[i])
                   for name, paper in TABLE2.items()
                   for i, mech in enumerate(("softmax", "coda"))],
            note="Pointwise DecompAtt, binary softmax loss, candidates ranked by log "
                 "p(relevant) per question (ties by file order; questions without a correct "
                 "answer skipped, the standard filtered evaluation). Paper: 20 epochs, Adam "
                 "3e-4, hidden 200, batch 64; tested with the checkpoint of the best "
                 "validation MAP (R10@1 for UDC). R10@1 is P@1 over the ten candidates; "
                 "MAP/MRR are reported for UDC too but the paper gives none.",
        ),
        "table8": Grid(
            name="table8",
            title="CoDA Table 8, WikiQA: centering of E and N, development MAP / MRR (%)",
            metrics={"MAP": "val/map_best", "MRR": "val/mrr_at_best_map"},
            cells=[Cell(f"wikiqa-{center}", dataset_config("wikiqa") + CODA + args,
                        TABLE8[center]) for center, args in CENTERING.items()],
            note="The best validation MAP of the run and the MRR of that validation; "
                 "the SciTail and DNLI columns are coda_nli's grid table8.",
        ),
    },
)

if __name__ == "__main__":
    from experiments.harness.runner import main

    main(EXPERIMENT)
