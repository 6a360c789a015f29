"""Samples to token ids: sample tokenizing (samples.py), chat rendering (chat.py), the loss-mask
kernels (masks.py), the encoders (encoders.py) and the choice between the Hugging Face back-end
and the exact fast one (backend.py)."""
