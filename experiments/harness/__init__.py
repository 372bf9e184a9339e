"""The machinery behind the experiment scripts of experiments/: what a script declares
(grids of cells), how its runs are launched, how a run folder is read back, the paired
tests, and the reports, plots, curves and claims board made from them.  Its layers and
their imports: docs/design.md, "The experiments' machinery"."""
