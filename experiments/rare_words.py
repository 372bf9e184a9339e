"""``python -m experiments.rare_words``: the attention density matrix paper's rare-word
measure on a run's hypotheses (experiments/harness/rare_words.py)."""

if __name__ == "__main__":
    from experiments.harness.rare_words import main

    main()
