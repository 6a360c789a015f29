"""Helpers the tests share, one module per subject: model_batch (a packed batch for model
tests), streams (a synthetic row stream), tokenizers (tiny and Qwen tokenizers built offline),
inputs, serve (real `packfeed serve` processes), train (real `packfeed train` runs), s3 (a
loopback S3 server and a fault proxy), stores, store_runs, tls, deploy, packing_optimum."""
