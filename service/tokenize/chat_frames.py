"""Chat templates known by what they render: a fixed text around each turn's content.

Many templates (ChatML written any way, Qwen2.5 with its default system turn, Llama 3, Gemma)
render a conversation as fixed texts between the contents, which depend only on the roles on
either side::

    lead[r0] + c0 + link[r0, r1] + c1 + ... + c_last + close[r_last]   (gen_close with a generation prompt)

For ChatML, ``lead["user"] == "<|im_start|>user\\n"``, ``link["user", "assistant"] ==
"<|im_end|>\\n<|im_start|>assistant\\n"``, ``close["assistant"] == "<|im_end|>\\n"``.
``learn_frames`` finds those texts by rendering probe conversations through the template once
(a conversation of each role and of each pair of roles, with sentinel contents), then checks
them on every role sequence of up to four turns and on contents of several kinds (inner
whitespace and newlines, quotes, braces, markup, ``<think>`` tags, non-ASCII, edge whitespace,
empty), every prefix with and without the generation prompt. A template that renders one of
them otherwise is not framed (the reason is returned); one that only strips edge whitespace
(Llama 3's ``| trim``) or changes an empty content is framed for the other contents. Roles,
pairs and contents the probes did not render alike are not accepted (Jinja renders them).

``FramedTemplate`` renders accepted conversations and their trained spans in Python, the same
spans as ``ChatRenderer``'s prefix renders (chat.py); with the fast encoder its conversations
are tokenized from their turns (fast/chat_tokens.py). A template that renders like this on the
probes but differs on some other content is caught where the learned rendering is checked
against Jinja: on the driver's probed rows, and on each actor's first conversations
(``ChatRenderer``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable

ROLES = ("system", "user", "assistant")
_SENTINEL = "Zq{}xQprobe"  # contents no template holds: located by str.find
# contents the probes render, by kind: the framing must hold on every "inner" one
INNER = ["hello world", "two\nlines\n\nand a blank one", "it's \"quoted\" {{ braces }} {% tag %} <b>x</b>",
         "<think>a</think> b", "naïve 日本語 🦩", "1 + 2 = 3;\tok"]
EDGES = [" lead", "trail ", "\nnewlines\n", "  both  ", "\t"]


@dataclass(frozen=True)
class FramedTemplate:
    """A chat template's fixed texts between contents (module docstring), learned by ``learn_frames``.

    ``empty``/``empty_gen``: what it renders for no messages (None: it raises).
    ``edge_whitespace``: contents with leading or trailing whitespace render as they are;
    ``empty_content``: an empty content does."""

    name: str
    lead: dict[str, str]
    link: dict[tuple[str, str], str]
    close: dict[str, str]
    gen_close: dict[str, str]
    empty: str | None
    empty_gen: str | None
    edge_whitespace: bool
    empty_content: bool

    def accepts(self, messages: list, tools: list | None) -> bool:
        """Whether this renders ``messages`` and their spans exactly as the template does: a
        non-empty list of ``{"role", "content"}`` dicts of strings whose roles, role pairs and
        contents the probes rendered alike, and whose assistant turns start where a prefix
        render with the generation prompt ends."""
        if tools or not messages or type(messages) is not list:
            return False
        prev = None
        for m in messages:
            if type(m) is not dict or len(m) != 2:
                return False
            role, content = m.get("role"), m.get("content")
            if type(role) is not str or type(content) is not str or role not in self.close:
                return False
            if not self._content_ok(content):
                return False
            if prev is None:
                if role not in self.lead or (role == "assistant" and self.assistant_from(None) is None
                                             and not self.lead["assistant"].startswith(self.empty_gen)):
                    return False
            elif (prev, role) not in self.link or (role == "assistant" and not self._gen_prefix(prev)):
                return False
            elif prev == "assistant" and not self.link[prev, role].startswith(self.close[prev]):
                return False  # the assistant turn's span would not end where a prefix render does
            prev = role
        return True

    def _content_ok(self, content: str) -> bool:
        if not content:
            return self.empty_content
        return self.edge_whitespace or content == content.strip()

    def _gen_prefix(self, prev: str) -> bool:
        """Whether a prefix ending in a ``prev`` turn, rendered with the generation prompt, is a
        prefix of the conversation whatever comes after (the assistant turn's span starts there)."""
        return self.link[prev, "assistant"].startswith(self.gen_close[prev])

    def render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (accepted ones, or a prefix of them)."""
        if not messages:
            text = self.empty_gen if generation_prompt else self.empty
            if text is None:
                raise ValueError(f"the {self.name} template fails on an empty conversation")
            return text
        parts = [self.lead[messages[0]["role"]]]
        prev = None
        for m in messages:
            if prev is not None:
                parts.append(self.link[prev, m["role"]])
            parts.append(m["content"])
            prev = m["role"]
        parts.append((self.gen_close if generation_prompt else self.close)[prev])
        return "".join(parts)

    def conversation(self, messages: list[dict]) -> tuple[str, list]:
        """``render(messages)`` and the spans of its assistant turns, in one render: what
        ``ChatRenderer.conversation`` finds by rendering prefixes."""
        full = self.render(messages)
        spans, at, prev = [], len(self.lead[messages[0]["role"]]), None
        last = len(messages) - 1
        for i, m in enumerate(messages):
            role = m["role"]
            if prev is not None:
                at += len(self.link[prev, role])
            end = at + len(m["content"])
            if role == "assistant":
                if prev is None:
                    lo = 0 if self.empty_gen is None else len(self.empty_gen)
                else:
                    lo = at - len(self.link[prev, role]) + len(self.gen_close[prev])
                hi = len(full) if i == last else end + len(self.close[role])
                if hi > lo:
                    spans.append((lo, hi))
            at, prev = end, role
        return full, spans

    # ---- what the turn encoder asks (fast/chat_tokens.py) ----------------------------------------
    def fixed_lead(self, role: str) -> str:
        return self.lead[role]

    def fixed_link(self, prev: str, role: str) -> str:
        return self.link[prev, role]

    def fixed_close(self, role: str) -> str:
        return self.close[role]

    def assistant_from(self, prev: str | None) -> str | None:
        """Where an assistant turn after a ``prev`` turn (None: the first) starts being trained:
        "content" (its content's first character), "start" (the conversation's first token: the
        template fails on no messages), None (elsewhere)."""
        if prev is None:
            if self.empty_gen is None:
                return "start"
            return "content" if self.empty_gen == self.lead["assistant"] else None
        return "content" if self.gen_close[prev] == self.link[prev, "assistant"] else None

    def assistant_close(self) -> str:
        """The text after an assistant turn's content that its span covers."""
        return self.close["assistant"]


def learn_frames(render: Callable[[list[dict], bool], str], name: str) -> FramedTemplate | str:
    """The template behind ``render(messages, generation_prompt)`` as fixed texts between the
    contents, or the reason it is not of that form (module docstring). Cost: at most ~2,600 renders
    (the probes of every role sequence of up to four turns, each prefix both ways, three kinds of contents)."""
    def probe(roles: tuple[str, ...], gen: bool, contents: list[str] | None = None) -> tuple[str, list[int]] | None:
        contents = contents or [_SENTINEL.format(k) for k in range(len(roles))]
        try:
            text = render([{"role": r, "content": c} for r, c in zip(roles, contents)], gen)
        except Exception:
            return None
        if type(text) is not str:
            return None
        at, ends = 0, []
        for c in contents:
            found = text.find(c, at)
            if found < 0:
                return None
            ends += [found, found + len(c)]
            at = found + len(c)
        return text, ends

    lead, close, gen_close, link = {}, {}, {}, {}
    for r in ROLES:
        plain, gen = probe((r,), False), probe((r,), True)
        if plain is None or gen is None or plain[0][:plain[1][0]] != gen[0][:gen[1][0]]:
            continue
        lead[r], close[r], gen_close[r] = plain[0][:plain[1][0]], plain[0][plain[1][1]:], gen[0][gen[1][1]:]
    for pair in itertools.product(lead, repeat=2):
        got = probe(pair, False)
        if got is not None:
            text, ends = got
            if text[:ends[0]] == lead[pair[0]] and text[ends[3]:] == close[pair[1]]:
                link[pair] = text[ends[1]:ends[2]]
    if "assistant" not in lead or not link:
        return f"the {name} template does not render one assistant turn and two turns as fixed text around contents"

    def rendered(messages: list[dict], gen: bool) -> str | None:
        try:
            return render(messages, gen)
        except Exception:
            return None

    framed = FramedTemplate(name, lead, link, close, gen_close, rendered([], False), rendered([], True), True, True)
    sequences = [s for n in range(1, 5) for s in itertools.product(ROLES, repeat=n)]

    def differs(framed: FramedTemplate, kinds: list[str]) -> str | None:
        """The first accepted probe (every prefix, with and without the generation prompt) that
        the template renders otherwise."""
        for k, roles in enumerate(sequences):
            messages = [{"role": r, "content": kinds[(k + i) % len(kinds)]} for i, r in enumerate(roles)]
            if not framed.accepts(messages, None):
                continue
            for n, gen in itertools.product(range(1, len(messages) + 1), (False, True)):
                if rendered(messages[:n], gen) != framed.render(messages[:n], gen):
                    return (f"the {name} template renders roles {list(roles[:n])} with contents "
                            f"{[m['content'] for m in messages[:n]]!r} otherwise than as fixed text around them")
        return None

    reason = differs(framed, INNER)
    if reason is not None:
        return reason
    if differs(framed, EDGES) is not None:
        framed = replace(framed, edge_whitespace=False)
    if differs(framed, [""]) is not None:
        framed = replace(framed, empty_content=False)
    return framed
