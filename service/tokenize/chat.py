"""Chat rendering: conversations to text exactly as ``apply_chat_template`` renders them, with
the character spans of the assistant turns that the loss trains.

Assistant turns without ``{% generation %}`` markers: turn i spans the characters from the end
of ``render(messages[:i], add_generation_prompt=True)`` to the end of
``render(messages[:i+1])``, so the turn's end marker is trained and its header is not; a
token is trained when its first character falls in a span (samples.py, encoders.py). For
ChatML::

    <|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n[hello<|im_end|>\\n]

That needs a prefix-preserving template (rendering a prefix of the conversation gives a prefix
of the text); a template that is not raises ``ChatTemplateError``. Templates WITH
``{% generation %}`` markers use them instead, as TRL does.

Cost: 1 + 2 x (assistant turns) compiled-template renders per conversation when only assistant
turns are trained, one render under ``loss="all"``: ~9 us for a one-message prefix and ~20 us for
four messages with Qwen2.5's template (the sandboxed template's own work; most of what is left of
a chat sample's Python cost per token, bench/bench_tokenize.py).
"""

from __future__ import annotations

import re
from typing import Any

from packfeed.service.inputs.read import RawWindow
from packfeed.service.inputs.records import Conversation

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot give the loss mask asked for."""


class ChatRenderer:
    """Renders conversations exactly as ``apply_chat_template(..., tokenize=False)`` does.

    Uses transformers' compiled Jinja template directly, with the same template variables (the
    special tokens map, ``tools``, ``documents=None``), and calls its render function on a
    context built from one prepared dict: ~13 us for a one-message prefix against ~30 us
    through ``Template.render`` and ~100 us through apply_chat_template (the per-call context
    merging is most of a short render). Falls back to apply_chat_template if those internals move.
    """

    def __init__(self, tokenizer: Any, name: str) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {name!r} has no chat template, and `messages` rows (or prompt/completion given as "
                "messages) need one: give a tokenizer whose tokenizer_config.json (or chat_template.jinja) has one, "
                "or rows of `text` or of string prompt/completion"
            )
        self._tok, self._name = tokenizer, name
        self._kwargs = dict(tokenizer.special_tokens_map)
        self._ctu = None
        self._compiled: dict[str, tuple[Any, dict[str, Any]]] = {}  # template -> (template, its fixed variables)
        try:
            from transformers.utils import chat_template_utils as ctu
        except ImportError:
            return
        needed = ("_compile_jinja_template", "_plain_template_data", "_alias_reasoning_fields", "render_jinja_template")
        if all(hasattr(ctu, n) for n in needed):
            self._ctu = ctu
            self._kwargs = ctu._plain_template_data(self._kwargs)

    def _template(self, tools: list | None) -> str:
        return self._tok.get_chat_template(None, tools)

    def render(self, messages: list[dict], tools: list | None, generation_prompt: bool = False) -> str:
        if self._ctu is None:
            return self._tok.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
            )
        source = self._template(tools)
        compiled = self._compiled.get(source)
        if compiled is None:
            template = self._ctu._compile_jinja_template(source)
            # Template.render(**kw) renders in a context over dict(template.globals, **kw): the same dict here
            fixed = {**template.globals, "documents": None, **self._kwargs}
            compiled = self._compiled[source] = (template, fixed)
        template, fixed = compiled
        context = template.new_context(
            {**fixed, "messages": messages, "tools": tools, "add_generation_prompt": generation_prompt}, shared=True
        )
        return template.environment.concat(template.root_render_func(context))

    def _plain(self, messages: list[dict], tools: list | None) -> tuple[list[dict], list | None]:
        """The template's inputs as transformers gives them: plain JSON types (its
        ``_plain_template_data``), reasoning fields aliased. Messages of string fields only
        (the common case: records.py built them from JSON) are already plain and pass as they are."""
        if self._ctu is None:
            return messages, tools
        ctu = self._ctu
        if not all(type(v) is str for m in messages for v in m.values()):  # keys: from JSON objects, str
            messages = ctu._plain_template_data(messages)
        return ctu._alias_reasoning_fields(messages), None if tools is None else ctu._plain_template_data(tools)

    def conversation(self, messages: list[dict], tools: list | None, all_loss: bool) -> tuple[str, list]:
        """The rendered text and the character spans of its assistant turns."""
        messages, tools = self._plain(messages, tools)
        if all_loss:
            return self.render(messages, tools), []
        template = self._template(tools)
        if self._ctu is not None and _GENERATION_TAG.search(template):
            rendered, indices = self._ctu.render_jinja_template(
                conversations=[messages], tools=tools, chat_template=template,
                return_assistant_tokens_mask=True, **self._kwargs,
            )  # fmt: skip
            return rendered[0], [tuple(s) for s in indices[0]]
        full = self.render(messages, tools)
        spans = []
        last = len(messages) - 1
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            lo = self._prefix_length(messages[:i], tools, full, True)
            hi = len(full) if i == last else self._prefix_length(messages[: i + 1], tools, full, False)
            if hi > lo:
                spans.append((lo, hi))
        return full, spans

    def prompt_completion(self, prompt: list, completion: list, tools: list | None, all_loss: bool) -> tuple[str, list]:
        """The rendered prompt + completion and the span of the completion (after the generation prompt)."""
        prompt, tools = self._plain(prompt, tools)
        completion, _ = self._plain(completion, None)
        full = self.render(prompt + completion, tools)
        if all_loss:
            return full, []
        return full, [(self._prefix_length(prompt, tools, full, True), len(full))]

    def preference(self, prompt: list, chosen: list, rejected: list, tools: list | None) -> tuple[str, str, str]:
        """A conversational preference pair as TRL's DPOTrainer renders it: the prompt with the
        generation prompt, prompt + chosen and prompt + rejected (tokens decide where the
        answers start: tokenize/pairs.py)."""
        prompt, tools = self._plain(prompt, tools)
        chosen, _ = self._plain(chosen, None)
        rejected, _ = self._plain(rejected, None)
        return (self.render(prompt, tools, True), self.render(prompt + chosen, tools),
                self.render(prompt + rejected, tools))

    def _prefix_length(self, prefix: list[dict], tools: list | None, full: str, generation_prompt: bool) -> int:
        if not prefix:  # a conversation that opens with the assistant
            try:
                text = self.render(prefix, tools, generation_prompt)
            except Exception:
                return 0
        else:
            text = self.render(prefix, tools, generation_prompt)
        if not full.startswith(text):
            at = next((k for k, (a, b) in enumerate(zip(text, full)) if a != b), min(len(text), len(full)))
            raise ChatTemplateError(
                f"the chat template of {self._name!r} is not prefix-preserving: messages[:{len(prefix)}] rendered "
                f"with add_generation_prompt={generation_prompt} differ from the whole conversation at character "
                f"{at} ({text[at:at + 40]!r} vs {full[at:at + 40]!r}), so assistant turns cannot be located. Use "
                "loss='all', or a template with {% generation %}...{% endgeneration %} around assistant output"
            )
        return len(text)


def render_record(renderer: ChatRenderer, raw: RawWindow, i: int, all_loss: bool) -> tuple[str, list]:
    """Record ``i`` of ``raw`` rendered, with its trained character spans; a ChatTemplateError
    names the record's file, row and sample."""
    r = raw.records[i]
    try:
        if type(r) is Conversation:
            return renderer.conversation(r.messages, r.tools, all_loss)
        return renderer.prompt_completion(r.prompt, r.completion, r.tools, all_loss)
    except ChatTemplateError as e:
        raise locate_error(e, raw, i) from None


def locate_error(e: ChatTemplateError, raw: RawWindow, i: int) -> ChatTemplateError:
    """``e`` prefixed with the file, row and sample id of record ``i`` of ``raw``."""
    source, row = raw.spec.locate(int(raw.sample_ids[i]))
    return ChatTemplateError(f"{source}: row {row}, sample {int(raw.sample_ids[i])}: {e}")
