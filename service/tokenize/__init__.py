"""Samples to token ids: sample tokenizing, chat rendering, loss masks, the encoders and the choice
between the Hugging Face back-end and the exact fast one."""
