"""A tokenizer as the packing actors receive it: loaded once on the driver, rebuilt in each
actor without transformers.

The driver loads the user's tokenizer with ``AutoTokenizer`` (a Hub id, a class that rewrites
its post-processor at load, a chat template in any of the files transformers reads) and, for
the fast back-end, runs steps 1-3 of its proof (backend.py). ``ShippedTokenizer.of`` keeps what
packing uses of it: the Rust backend's JSON as transformers left it, the eos and pad ids, the
vocabulary size, the special tokens map, the chat templates as ``get_chat_template`` picks
them, and the proof (quicktok's imported files, or the refusal). An actor rebuilds the backend
with ``tokenizers`` alone: no ``import transformers`` (seconds per process, torch included),
no quicktok import or stress texts (seconds for a 150k vocabulary). Step 4 of
the proof (the actor's first window through both back-ends) still runs in every actor.

Chat rendering (chat.py) reads the templates from here. Known templates (ChatML, Qwen2.5) are
rendered in Python; others, and the messages those cannot render, with transformers' template
compiler (``transformers.utils.chat_template_utils``, 0.5 s to import, no torch), imported only
in an actor that needs it.
"""

from __future__ import annotations

import copy
from typing import Any

from packfeed.service.tokenize.fast.backend import FastProof
from packfeed.service.tokenize.hf_hub import hub_kwargs

_NO_TOOLS, _TOOLS = "no_tools", "tools"


class ShippedTokenizer:
    """The parts of a loaded Hugging Face fast tokenizer that ``SampleTokenizer`` and
    ``ChatRenderer`` use, picklable, with the same names (a duck-typed stand-in)."""

    def __init__(self, *, name_or_path: str, backend_json: str, eos_token_id: int | None, pad_token_id: int | None,
                 vocab_size: int, special_tokens_map: dict, chat_template: Any, chat_templates: dict,
                 fast_proof: FastProof | None, native_chat: bool = True) -> None:  # fmt: skip
        self.name_or_path = name_or_path
        self.backend_json = backend_json
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.vocab_size = vocab_size
        self.special_tokens_map = special_tokens_map
        self.chat_template = chat_template  # as the tokenizer has it: a str, {name: str}, or None
        self._chat_templates = chat_templates  # what get_chat_template(None, tools) gave: (template, error)
        self.fast_proof = fast_proof
        self.native_chat = native_chat  # False: the driver saw chat.py's Python rendering differ from Jinja
        self._backend: Any = None
        self._full: Any = None

    @classmethod
    def of(cls, tokenizer: Any, fast_proof: FastProof | None = None, *, native_chat: bool = True) -> ShippedTokenizer:
        """The snapshot of ``tokenizer`` (a loaded ``PreTrainedTokenizerFast``), the proof
        of steps 1-3 run on its backend (``EncoderChoice.proof``), and whether known chat
        templates may be rendered in Python (chat.py)."""
        if isinstance(tokenizer, ShippedTokenizer):  # the driver's own, from a snapshot (snapshots.py)
            if (fast_proof is None or fast_proof is tokenizer.fast_proof) and native_chat == tokenizer.native_chat:
                return tokenizer
            shipped = copy.copy(tokenizer)
            shipped.fast_proof = tokenizer.fast_proof if fast_proof is None else fast_proof
            shipped.native_chat = native_chat
            shipped._backend = tokenizer._backend  # built already in this process (the copy drops it)
            return shipped
        templates = {}
        for key, tools in ((_NO_TOOLS, None), (_TOOLS, [])):
            try:
                templates[key] = (tokenizer.get_chat_template(None, tools), None)
            except Exception as e:  # no template, or several and none named default: said when used
                templates[key] = (None, f"{type(e).__name__}: {e}")
        shipped = cls(
            name_or_path=str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
            backend_json=tokenizer.backend_tokenizer.to_str(),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            vocab_size=len(tokenizer),
            special_tokens_map=dict(tokenizer.special_tokens_map),
            chat_template=getattr(tokenizer, "chat_template", None),
            chat_templates=templates,
            fast_proof=fast_proof,
            native_chat=native_chat,
        )
        shipped._backend = tokenizer.backend_tokenizer  # this process's, shared (pickling drops it)
        return shipped

    def snapshot(self) -> tuple[dict, str]:
        """What snapshots.py keeps of it (the proof is not kept: it is run again, cached by
        quick_cache.py): its fields as JSON-able data, and the backend's JSON."""
        fields = {"eos_token_id": self.eos_token_id, "pad_token_id": self.pad_token_id,
                  "vocab_size": self.vocab_size, "special_tokens_map": self.special_tokens_map,
                  "chat_template": self.chat_template, "chat_templates": self._chat_templates}
        return fields, self.backend_json

    @classmethod
    def from_snapshot(cls, fields: dict, backend_json: str, name_or_path: str) -> ShippedTokenizer:
        """``snapshot()``'s data back, named ``name_or_path`` (the directory as given now)."""
        templates = {key: (fields["chat_templates"][key][0], fields["chat_templates"][key][1])
                     for key in (_NO_TOOLS, _TOOLS)}
        return cls(name_or_path=name_or_path, backend_json=backend_json, eos_token_id=fields["eos_token_id"],
                   pad_token_id=fields["pad_token_id"], vocab_size=int(fields["vocab_size"]),
                   special_tokens_map=dict(fields["special_tokens_map"]), chat_template=fields["chat_template"],
                   chat_templates=templates, fast_proof=None)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_backend", "_full")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _backend=None, _full=None)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def backend_tokenizer(self) -> Any:
        """The Rust backend, built once from its JSON (the driver's, byte for byte)."""
        if self._backend is None:
            from tokenizers import Tokenizer

            self._backend = Tokenizer.from_str(self.backend_json)
        return self._backend

    def get_chat_template(self, chat_template: None = None, tools: list | None = None) -> str:
        """The template ``apply_chat_template`` would use (packing names none): transformers
        picks the tools one when ``tools`` is given (not None); the driver asked it both ways."""
        if chat_template is not None:
            raise ValueError("a shipped tokenizer keeps the templates transformers picks by default, not named ones")
        template, error = self._chat_templates[_TOOLS if tools is not None else _NO_TOOLS]
        if template is None:
            raise ValueError(error)
        return template

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        """transformers' own, on the tokenizer loaded again (ChatRenderer's fallback when the
        compiler's internals it uses have moved)."""
        return self._full_tokenizer().apply_chat_template(*args, **kwargs)

    def _full_tokenizer(self) -> Any:
        if self._full is None:
            from transformers import AutoTokenizer

            self._full = AutoTokenizer.from_pretrained(self.name_or_path, **hub_kwargs(self.name_or_path))
        return self._full
