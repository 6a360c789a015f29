"""The Ray Data pipeline: Ray start-up and placement, packing actors that process one window each
(read, tokenize, pack), and the run's statistics."""
