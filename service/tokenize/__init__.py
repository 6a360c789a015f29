"""Samples to token ids: sample tokenizing and loading (samples.py), chat rendering (chat.py),
the loss-mask kernels (masks.py), preference pairs (pairs.py), the Hugging Face encoder
(encoders.py) and Hub names (hf_hub.py). The optional fast path, quicktok's exact encoder and
the proof that picks it, is a room of its own: fast/."""
