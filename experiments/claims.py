"""``python -m experiments.claims``: the claims board, results/CLAIMS.md
(experiments/harness/claims.py)."""

if __name__ == "__main__":
    from experiments.harness.claims import main

    main()
