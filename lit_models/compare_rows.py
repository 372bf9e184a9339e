"""What the attention comparison (experiments/attention_compare.py, issue 45) and its cost
benchmark (``python -m benchmarks.model_cost --model compare``) share: the links between a
text classifier and its DataModule (:data:`LINKS`), and the comparison's rows, each mechanism
with its paper defaults as TransformerClassifier's command-line flags
(:func:`mechanism_rows`).

Held beside the models, as lit_models/mt_rows.py, so that experiments/ and benchmarks/ read
the same lists: benchmarks may import lit_models, never experiments.  The mechanisms come
from the caller (the registry's, ``attention.registry.supporting("multihead")``; the
experiment reads the same names from the source, ``experiments.harness.sources``), so a mechanism
registered later becomes a row by itself.
"""

from __future__ import annotations

#: (DataModule attribute, model argument) pairs of the text classifiers
LINKS = [("vocab_size", "vocab_size"), ("pad_id", "pad_id"), ("num_classes", "num_classes")]

#: a mechanism with more than one setting in its paper, one row per setting: the
#: Differentiable Window's multiplicative and additive windows (its Table 5's Enc (MW) and
#: Enc (AW)); every other mechanism is one row with its class's defaults, the paper's
VARIANTS = {"window": {"window-mw": ["--model.attention=window", "--model.attention.variant=mw"],
                       "window-aw": ["--model.attention=window", "--model.attention.variant=aw"]}}

#: the CoDA setting the MLU decoder study chose (experiments/coda_mlu.py: grid ``study``, by the
#: rule of configs/coda_mlu/study.yaml): the gate's bias beta 0.25 instead of the paper's 1
CHOSEN_CODA = ["--model.attention=coda", "--model.attention.beta=0.25"]
#: its row in the comparison
CHOSEN_CODA_ROW = "coda-beta0.25"


def mechanism_rows(mechanisms: list[str]) -> dict[str, list[str]]:
    """Row name -> flags: each of ``mechanisms`` (registry names, in their order) with its
    paper defaults (its :data:`VARIANTS` where it has several), then :data:`CHOSEN_CODA`
    when ``coda`` is among them."""
    rows: dict[str, list[str]] = {}
    for name in mechanisms:
        rows.update(VARIANTS.get(name) or {name: [f"--model.attention={name}"]})
    if "coda" in mechanisms:
        rows[CHOSEN_CODA_ROW] = list(CHOSEN_CODA)
    return rows
