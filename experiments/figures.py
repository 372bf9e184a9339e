"""``python -m experiments.figures coda_fig2 --out results`` and the notebooks' other figure
studies (experiments/harness/figures.py)."""

if __name__ == "__main__":
    from experiments.harness.figures import main

    main()
