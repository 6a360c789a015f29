"""The Ray Data pipeline: Ray start-up and placement, the packing actors (``PackingScaling``: how
many, where) that process one window each (read, tokenize, pack), the run's statistics
(stats.py; as people read them: summary.py), the checks every command makes before Ray
(preflight.py), and ``run_pack`` (pack_run.py: pack's Ray beside its checks in ray_beside.py, its
account of the run in pack_report.py), the pipeline's rows into a packed directory."""
