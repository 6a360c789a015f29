"""Samples to token ids: sample tokenizing and loading (samples.py), each sample format encoded as
a batch and merged back in record order (format_groups.py), chat rendering (chat.py), the
loss-mask kernels (masks.py), preference pairs (pair_tokens.py), the Hugging Face encoder
(encoders.py) and Hub names (hf_hub.py). The optional fast path, quicktok's exact encoder and
the proof that picks it, is a room of its own: fast/."""
