"""``python -m experiments.curves <experiment> <grid> --config NAME --out PATH``: a grid's
learning curves as committed data and a plot (experiments/harness/curves.py)."""

if __name__ == "__main__":
    from experiments.harness.curves import main

    main()
