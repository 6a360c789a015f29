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

Cost: 1 + 2 x (assistant turns) renders per conversation when only assistant turns are trained,
one render under ``loss="all"``. Through transformers' compiled Jinja template a render takes ~9 us
for a one-message prefix and ~20 us for four messages with Qwen2.5's template: as much time as
encoding the chat. Known templates are therefore rendered in Python (``ChatML``: a conversation
and its spans in one render of a few microseconds), picked by the template's exact text
(``known_template``) and only for the messages whose rendering they reproduce (string contents,
known roles, no tools or tool calls). A template not known by its text is known by what it
renders when that is fixed text around each turn's content (chat_frames.py: learned by
rendering probe conversations through it once per process, checked against Jinja on its first
``VERIFIED_CONVERSATIONS`` conversations). Everything else goes through Jinja, each such
sample counted (``ChatRenderer.paths``) and each template's reason kept
(``ChatRenderer.reasons``). The equality is proven by sweeps against Jinja in the tests
(tests/unit/service/tokenize/test_chat_native.py, test_chat_frames.py) and checked again on
every run: the driver renders the probed conversations both ways, and a difference sends the
whole run through Jinja (``SampleTokenizer.check_chat_template``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from packfeed.service.inputs.read import RawWindow
from packfeed.service.inputs.records import Conversation
from packfeed.service.tokenize.chat_frames import FramedTemplate, learn_frames

logger = logging.getLogger(__name__)
VERIFIED_CONVERSATIONS = 256  # a learned template's first conversations in a process, rendered both ways too
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot give the loss mask asked for."""


_GENERATION_PROMPT = "<|im_start|>assistant\n"
_TURN_MARKUP = len("<|im_start|>\n<|im_end|>\n")  # a turn's characters besides its role and content


@dataclass(frozen=True)
class ChatML:
    """A ChatML chat template, rendered in Python: each message as
    ``<|im_start|>{role}\\n{content}<|im_end|>\\n``, then ``<|im_start|>assistant\\n`` when a
    generation prompt is asked for. ``default_system``: the system turn the template writes
    first when ``messages[0]`` is not a system message (Qwen2.5's); such a template also fails
    on an empty conversation (it reads ``messages[0]``). ``roles``: the roles it renders in
    that form (None: any string)."""

    name: str
    default_system: str | None = None
    roles: frozenset[str] | None = None

    def accepts(self, messages: list, tools: list | None) -> bool:
        """Whether this renders ``messages`` exactly as the template does: a non-empty list of
        dicts with string ``role`` (one of ``roles``) and ``content``, no ``tool_calls``, no tools."""
        if tools or not messages:
            return False
        roles = self.roles
        for m in messages:
            if type(m) is not dict or m.get("tool_calls"):
                return False
            role = m.get("role")
            if type(role) is not str or type(m.get("content")) is not str or (roles is not None and role not in roles):
                return False
        return True

    def render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (accepted ones, or an empty prefix)."""
        parts = []
        if self.default_system is not None:
            if not messages:
                raise ValueError(f"the {self.name} template reads messages[0]: an empty conversation fails")
            if messages[0]["role"] != "system":
                parts.append(f"<|im_start|>system\n{self.default_system}<|im_end|>\n")
        parts += [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
        if generation_prompt:
            parts.append(_GENERATION_PROMPT)
        return "".join(parts)

    # ---- the fixed texts between contents, as the turn encoder asks them (chat_frames.py) --------------
    def fixed_lead(self, role: str) -> str:
        opening = "" if self.default_system is None or role == "system" else (
            f"<|im_start|>system\n{self.default_system}<|im_end|>\n")
        return f"{opening}<|im_start|>{role}\n"

    def fixed_link(self, prev: str, role: str) -> str:
        return f"<|im_end|>\n<|im_start|>{role}\n"

    def fixed_close(self, role: str) -> str:
        return "<|im_end|>\n"

    def assistant_from(self, prev: str | None) -> str:
        """"content" (an assistant turn trains from its content), or "start" (from the
        conversation's first token: a template with a default system turn that opens with it)."""
        return "start" if prev is None and self.default_system is not None else "content"

    def assistant_close(self) -> str:
        return "<|im_end|>\n"

    def conversation(self, messages: list[dict]) -> tuple[str, list]:
        """``render(messages)`` and the spans of its assistant turns, in one render: what
        ``ChatRenderer.conversation`` finds by rendering prefixes (from the end of the turn's
        header to the end of the turn; from the start of the text for a conversation that opens
        with the assistant, where the template fails on the empty prefix)."""
        full = self.render(messages)
        spans = []
        end = len(full)
        for i in range(len(messages) - 1, -1, -1):  # each turn's end is the next one's start
            m = messages[i]
            start = end - len(m["role"]) - len(m["content"]) - _TURN_MARKUP
            if m["role"] == "assistant":
                lo = 0 if i == 0 and self.default_system is not None else start + len(_GENERATION_PROMPT)
                if end > lo:
                    spans.append((lo, end))
            end = start
        return full, spans[::-1]


# Templates rendered in Python, by the SHA-256 of their text (one trailing newline dropped: Jinja
# drops it). The tests recompute each hash from the template's source.
KNOWN_TEMPLATES: dict[str, ChatML] = {
    # packfeed's bundled tokenizer (service/assets/build.py: CHATML_TEMPLATE)
    "17762d2e5131cb2a950db7dd5700c50095547773d3302b52baebe9ae32257a55": ChatML("chatml"),
    # Qwen2.5 (and -Instruct), as TRL ships it (trl/chat_templates/qwen2_5.jinja)
    "55b2f4a26ac9ee719330a61a0c39d9e538b0e9322212f048326318cff4f8674a": ChatML(
        "qwen2.5", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        frozenset(("system", "user", "assistant"))),
}


def template_hash(source: str) -> str:
    """The key of ``source`` in ``KNOWN_TEMPLATES``."""
    return hashlib.sha256(source.removesuffix("\n").encode()).hexdigest()


def known_template(source: str | None) -> ChatML | None:
    """The Python rendering of the chat template ``source``, if it is a known one."""
    return None if source is None else KNOWN_TEMPLATES.get(template_hash(source))


class ChatRenderer:
    """Renders conversations exactly as ``apply_chat_template(..., tokenize=False)`` does.

    A known template (``known_template``), or one learned from what it renders
    (chat_frames.py), renders the messages it accepts in Python. Otherwise
    transformers' compiled Jinja template is used directly, with the same template variables
    (the special tokens map, ``tools``, ``documents=None``), its render function called on a
    context built from one prepared dict: ~13 us for a one-message prefix against ~30 us
    through ``Template.render`` and ~100 us through apply_chat_template (the per-call context
    merging is most of a short render). Falls back to apply_chat_template if those internals
    move. The template compiler (``transformers.utils.chat_template_utils``, ~0.5 s to import)
    is imported on the first render that needs Jinja. ``native=False``: Jinja for everything.
    """

    def __init__(self, tokenizer: Any, name: str, *, native: bool = True) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {name!r} has no chat template, and `messages` rows (or prompt/completion given as "
                "messages) need one: give a tokenizer whose tokenizer_config.json (or chat_template.jinja) has one, "
                "or rows of `text` or of string prompt/completion"
            )
        self._tok, self._name, self._native = tokenizer, name, native
        self._known: dict[str, ChatML | FramedTemplate | None] = {}  # template -> its Python rendering, if any
        self._unverified: dict[str, int] = {}  # learned template -> conversations still to check against Jinja
        self.paths: Counter[str] = Counter()  # samples by path: "python", "jinja" ("turns": chat_tokens.py)
        self.reasons: dict[str, str] = {}  # template -> why Jinja renders it
        self._loaded = False
        self._kwargs = dict(tokenizer.special_tokens_map)
        self._ctu = None
        self._compiled: dict[str, tuple[Any, dict[str, Any]]] = {}  # template -> (template, its fixed variables)

    def _load_compiler(self) -> None:
        if self._loaded:
            return
        self._loaded = True
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

    def native_for(self, messages: list, tools: list | None) -> ChatML | FramedTemplate | None:
        """The Python rendering that gives ``messages`` (with ``tools``) the template's text, if
        any: a known template's (``known_template``), else the one learned from what the
        template renders (chat_frames.py), checked against Jinja on its first
        ``VERIFIED_CONVERSATIONS`` conversations here (a difference: Jinja from then on)."""
        if not self._native:
            return None
        source = self._template(tools)
        known = self._known.get(source, False)
        if known is False:
            known = self._known[source] = self._python_rendering(source)
        if known is None or not known.accepts(messages, tools):
            return None
        if self._unverified.get(source):
            self._unverified[source] -= 1
            if not self._renders_as_jinja(known, messages):
                self._known[source] = None
                self.reasons[source] = ("its learned rendering differs from Jinja on a conversation of the data: "
                                        f"{messages!r}")[:500]
                logger.warning("tokenizer %r: %s; Jinja renders its conversations", self._name, self.reasons[source])
                return None
        return known

    def _python_rendering(self, source: str) -> ChatML | FramedTemplate | None:
        """``source``'s known rendering, or its fixed texts learned by rendering probes through it."""
        known = known_template(source)
        if known is not None:
            return known
        if _GENERATION_TAG.search(source):
            self.reasons[source] = "its {% generation %} markers say which characters are trained"
            return None
        learned = learn_frames(lambda m, g: self._jinja(m, None, g), self._name)
        if isinstance(learned, str):
            self.reasons[source] = learned
            logger.info("tokenizer %r: %s; Jinja renders its conversations", self._name, learned)
            return None
        self._unverified[source] = VERIFIED_CONVERSATIONS
        return learned

    def _renders_as_jinja(self, known: FramedTemplate, messages: list[dict]) -> bool:
        """Whether ``known`` gives ``messages`` the text and spans Jinja's prefix renders give."""
        try:
            return known.conversation(messages) == self._prefix_spans(lambda m, g=False: self._jinja(m, None, g),
                                                                      messages)
        except Exception:
            return False

    def render(self, messages: list[dict], tools: list | None, generation_prompt: bool = False) -> str:
        native = self.native_for(messages, tools)
        if native is not None:
            return native.render(messages, generation_prompt)
        return self._jinja(messages, tools, generation_prompt)

    def _jinja(self, messages: list[dict], tools: list | None, generation_prompt: bool = False) -> str:
        self._load_compiler()
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

    def _prepared(self, messages: list[dict], tools: list | None) -> tuple[list[dict], list | None, Any, ChatML | None]:
        """The template's inputs, the render function for them (``(messages, generation_prompt)
        -> text``) and the known template that renders them (None: Jinja). A known template's
        accepted messages pass as they are; otherwise they are what transformers gives Jinja:
        plain JSON types (its ``_plain_template_data``), reasoning fields aliased. Messages of
        string fields only (the common case: records.py built them from JSON) are already plain
        and are not copied."""
        native = self.native_for(messages, tools)
        if native is not None:
            return messages, tools, native.render, native
        self._load_compiler()
        ctu = self._ctu
        if ctu is not None:
            if not all(type(v) is str for m in messages for v in m.values()):  # keys: from JSON objects, str
                messages = ctu._plain_template_data(messages)
            messages = ctu._alias_reasoning_fields(messages)
            tools = None if tools is None else ctu._plain_template_data(tools)
        return messages, tools, lambda m, g=False: self._jinja(m, tools, g), None

    def conversation(self, messages: list[dict], tools: list | None, all_loss: bool) -> tuple[str, list]:
        """The rendered text and the character spans of its assistant turns."""
        messages, tools, render, native = self._prepared(messages, tools)
        self.paths["jinja" if native is None else "python"] += 1
        if all_loss:
            return render(messages), []
        if native is not None:
            return native.conversation(messages)
        template = self._template(tools)
        if _GENERATION_TAG.search(template):
            self._load_compiler()
            if self._ctu is not None:
                rendered, indices = self._ctu.render_jinja_template(
                    conversations=[messages], tools=tools, chat_template=template,
                    return_assistant_tokens_mask=True, **self._kwargs,
                )  # fmt: skip
                return rendered[0], [tuple(s) for s in indices[0]]
        return self._prefix_spans(render, messages)

    def _prefix_spans(self, render: Any, messages: list[dict]) -> tuple[str, list]:
        """``render(messages)`` and its assistant turns' spans, found by rendering prefixes."""
        full = render(messages)
        spans = []
        last = len(messages) - 1
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            lo = self._prefix_length(render, messages[:i], full, True)
            hi = len(full) if i == last else self._prefix_length(render, messages[: i + 1], full, False)
            if hi > lo:
                spans.append((lo, hi))
        return full, spans

    def prompt_completion(self, prompt: list, completion: list, tools: list | None, all_loss: bool) -> tuple[str, list]:
        """The rendered prompt + completion and the span of the completion (after the generation prompt)."""
        messages, tools, render, native = self._prepared(prompt + completion, tools)
        self.paths["jinja" if native is None else "python"] += 1
        full = render(messages)
        if all_loss:
            return full, []
        return full, [(self._prefix_length(render, messages[: len(prompt)], full, True), len(full))]

    def preference(self, prompt: list, chosen: list, rejected: list, tools: list | None) -> tuple[str, str, str]:
        """A conversational preference pair as TRL's DPOTrainer renders it: the prompt with the
        generation prompt, prompt + chosen and prompt + rejected (tokens decide where the
        answers start: tokenize/pair_tokens.py)."""
        texts = []
        for messages, generation_prompt in ((prompt, True), (prompt + chosen, False), (prompt + rejected, False)):
            messages, _, render, _ = self._prepared(messages, tools)
            texts.append(render(messages, generation_prompt))
        return texts[0], texts[1], texts[2]

    def _prefix_length(self, render: Any, prefix: list[dict], full: str, generation_prompt: bool) -> int:
        if not prefix:  # a conversation that opens with the assistant
            try:
                text = render(prefix, generation_prompt)
            except Exception:
                return 0
        else:
            text = render(prefix, generation_prompt)
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
