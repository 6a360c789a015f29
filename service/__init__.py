"""packfeed.service: packing, tokenization, the Ray Data pipeline, the CLI."""
