"""packfeed.trainer: Ray Train loop and block-causal attention set-up."""
