"""The optional fast tokenizer path: quicktok's exact BPE where it proves itself equal to the
Hugging Face tokenizer (``--tokenizer-backend auto|hf|fast``).

``backend``      which encoder a process packs with, and the proof that decides it
``encoder``      ``FastEncoder``: HFEncoder's answers from quicktok and token byte lengths
``checks``       the load-time checks (special tokens, normalizer, post-processor, a sample set)
``chat_tokens``  a known ChatML template's conversations tokenized from their turns
``quick_cache``  quicktok's imported tokenizer files, cached per machine

Every run may take it, none needs it: the HF path (tokenize/encoders.py, samples.py) is the
reference, and this package is what a reader can skip to follow a sample into a row.
"""
