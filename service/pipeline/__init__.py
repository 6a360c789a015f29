"""The stream of packed rows over Ray Data: the packing actors (``PackingPipeline``,
ray_pipeline.py) that process one window each (window.py: read, tokenize, pack) with the
collector kept out of a window's work (collector.py), the run's statistics (stats.py; as people
read them: summary.py), the start-up by phase (startup.py), and the checks every command makes
before Ray (preflight.py). Ray itself (start, join, placement, scaling) is service/cluster/;
``packfeed pack``'s driver is service/packjob/."""
