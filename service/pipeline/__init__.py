"""The Ray Data pipeline: Ray start-up and placement, the packing actors (``PackingScaling``: how
many, where) that process one window each (read, tokenize, pack), the run's statistics, and
``run_pack`` (pack.py), the pipeline's rows into a packed directory."""
