"""Sample records: the formats, their validation, and the reasons a sample is skipped.

A reader (``read.py``) hands every row to the parser of its input's format; the parser
returns the record or raises ``InvalidRecord``, which the reader turns into a ``Skip``. The
tokenizer adds its own skips (``template_error``, ``tokenizer_error``, ``no_trained_tokens``).

Sample formats (TRL's): ``text`` ({"text": str}); ``prompt_completion`` ({"prompt",
"completion"}: both strings, or both lists of messages); ``messages`` ({"messages": [...]},
each message {"role": system|user|assistant|tool, "content": str | [{"type": "text",
"text": str}, ...]}); ``preference`` ({"prompt", "chosen", "rejected"}: all strings, or all
lists of messages; or implicit prompt: only "chosen" and "rejected", whole texts or
conversations whose shared beginning is the prompt, found as TRL's ``extract_prompt`` finds it).
An optional ``tools`` field (list, or JSON string) is kept for the chat template. The format is
given per source, or ``auto``: detected for every row from its own fields (a null field counts
as absent), so one file may mix formats: "chosen" or "rejected" -> preference; "messages" ->
messages; "prompt" and "completion" -> prompt_completion; "text" -> text (also beside only one
half of a pair); only one half and no "text" -> missing_field naming the other half; none ->
missing_field.

Validation rules (each failure is a ``Skip`` with one of ``SKIP_REASONS``): ``text`` and
``completion`` strings must hold a non-whitespace character; a ``prompt`` string may be empty;
``messages`` and conversational ``prompt``/``completion`` must be non-empty lists; a message's
content may be "" (empty system prompts are common); keys whose value is null are dropped from
messages, as ``apply_chat_template`` does; a message without content is accepted only when it
has ``tool_calls``. Records are returned as: text -> ``str``; prompt_completion ->
``PromptCompletion``; messages -> ``Conversation``; preference -> ``Preference`` (the prompt
extracted when implicit; its answers must be non-blank strings or non-empty message lists, and an
implicit conversational prompt must hold at least one message). A string ``prompt`` beside
conversational answers is ignored and the prompt extracted, as TRL's ``maybe_extract_prompt`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

MISSING = object()  # what get(key) returns for an absent key


# ---- skip reasons: the one place they are defined ------------------------------------------
BLANK_LINE = "blank_line"  # a JSONL line holding only whitespace
INVALID_UTF8 = "invalid_utf8"  # bytes that do not decode as UTF-8
MALFORMED_JSON = "malformed_json"  # a JSONL line that json.loads rejects
NOT_AN_OBJECT = "not_an_object"  # valid JSON, but not an object ({...})
MISSING_FIELD = "missing_field"  # a field the format requires is absent
EMPTY_FIELD = "empty_field"  # a required field is null, "", whitespace only, or []
WRONG_TYPE = "wrong_type"  # a field of the wrong type (e.g. text: 3, messages: "hi")
UNKNOWN_ROLE = "unknown_role"  # a message role outside MESSAGE_ROLES
UNSUPPORTED_CONTENT = "unsupported_content"  # a content part that is not text (image, audio)
UNREADABLE = "unreadable"  # the file reader could not decode these rows (corrupt or truncated file)
TEMPLATE_ERROR = "template_error"  # the chat template raised on this conversation
TOKENIZER_ERROR = "tokenizer_error"  # the tokenizer raised on this text (e.g. lone surrogate)
NO_TRAINED_TOKENS = "no_trained_tokens"  # nothing left to train (e.g. no assistant turn)
SKIP_REASONS = (
    BLANK_LINE,
    INVALID_UTF8,
    MALFORMED_JSON,
    NOT_AN_OBJECT,
    MISSING_FIELD,
    EMPTY_FIELD,
    WRONG_TYPE,
    UNKNOWN_ROLE,
    UNSUPPORTED_CONTENT,
    UNREADABLE,
    TEMPLATE_ERROR,
    TOKENIZER_ERROR,
    NO_TRAINED_TOKENS,
)

MESSAGE_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Skip:
    """A sample that is not trained on, and why. ``row`` is 0-based within ``source``;
    ``line`` is the 1-based line number for JSONL sources (None for other kinds)."""

    sample_id: int
    source: str
    row: int
    reason: str
    detail: str
    line: int | None = None

    def describe(self) -> str:
        """The one format every skip is shown in, e.g.
        ``data/chat.jsonl: row 1 (line 2), sample 112: malformed_json: Expecting value``."""
        where = f"row {self.row}" + (f" (line {self.line})" if self.line is not None else "")
        return f"{self.source}: {where}, sample {self.sample_id}: {self.reason}: {self.detail}"


class BadSampleError(ValueError):
    """Raised in strict mode for the first bad sample; ``.skip`` holds the details."""

    def __init__(self, skip: Skip) -> None:
        self.skip = skip
        super().__init__(f"{skip.describe()} (run without --strict to skip and count such samples)")

    def __reduce__(self):
        # Raised inside Ray actors: it must unpickle on the driver from its own arguments.
        return (_rebuild_bad_sample_error, (self.skip,))


def _rebuild_bad_sample_error(skip: Skip) -> "BadSampleError":
    return BadSampleError(skip)


class PromptCompletion(NamedTuple):
    """Both strings (standard) or both lists of message dicts (conversational)."""

    prompt: str | list[dict[str, Any]]
    completion: str | list[dict[str, Any]]
    tools: list[Any] | None = None


class Conversation(NamedTuple):
    messages: list[dict[str, Any]]
    tools: list[Any] | None = None


class Preference(NamedTuple):
    """A preference pair: all three strings (standard) or all three message lists
    (conversational); ``prompt`` already extracted for the implicit-prompt form."""

    prompt: str | list[dict[str, Any]]
    chosen: str | list[dict[str, Any]]
    rejected: str | list[dict[str, Any]]
    tools: list[Any] | None = None


class InvalidRecord(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        self.reason, self.detail = reason, detail


# ---- record validation -----------------------------------------------------------------------
# A parser takes get(key) -> value (or MISSING) and returns the record, or raises InvalidRecord.
# ``get.keys()`` lists the row's fields (for the message when none of a format's is there).
def _parse_text(get: Callable[[str], Any]) -> str:
    return _nonblank_str(get("text"), "text")


def _required(get: Callable[[str], Any], name: str) -> Any:
    """The value of field ``name``; InvalidRecord when it is missing or null."""
    value = get(name)
    if value is MISSING:
        raise InvalidRecord(MISSING_FIELD, f"no {name!r} field")
    if value is None:
        raise InvalidRecord(EMPTY_FIELD, f"{name!r} is null")
    return value


def _parse_prompt_completion(get: Callable[[str], Any]) -> PromptCompletion:
    prompt, completion = _required(get, "prompt"), _required(get, "completion")
    tools = _parse_tools(get("tools"))
    if isinstance(prompt, str) and isinstance(completion, str):
        return PromptCompletion(prompt, _nonblank_str(completion, "completion"), tools)
    if isinstance(prompt, list) and isinstance(completion, list):
        return PromptCompletion(_parse_messages(prompt, "prompt"), _parse_messages(completion, "completion"), tools)
    raise InvalidRecord(
        WRONG_TYPE,
        f"'prompt' ({type(prompt).__name__}) and 'completion' ({type(completion).__name__}) must both be "
        "strings or both be lists of messages",
    )


def _parse_conversation(get: Callable[[str], Any]) -> Conversation:
    messages = _required(get, "messages")
    if not isinstance(messages, list):
        raise InvalidRecord(WRONG_TYPE, f"'messages' is a {type(messages).__name__}, expected a list of messages")
    return Conversation(_parse_messages(messages, "messages"), _parse_tools(get("tools")))


def _parse_preference(get: Callable[[str], Any]) -> Preference:
    prompt, chosen, rejected = get("prompt"), _required(get, "chosen"), _required(get, "rejected")
    tools = _parse_tools(get("tools"))
    if isinstance(chosen, str) and isinstance(rejected, str):
        if not _present(prompt):
            prompt, chosen, rejected = extract_prompt(chosen, rejected)
        elif not isinstance(prompt, str):
            raise InvalidRecord(WRONG_TYPE, f"'prompt' is a {type(prompt).__name__}, but 'chosen'/'rejected' are strings")
        return Preference(prompt, _nonblank_str(chosen, "chosen"), _nonblank_str(rejected, "rejected"), tools)
    if isinstance(chosen, list) and isinstance(rejected, list):
        if not isinstance(prompt, list):  # absent, or a plain-text copy of the prompt (TRL ignores it too)
            prompt, chosen, rejected = extract_prompt(chosen, rejected)
            if not prompt:
                raise InvalidRecord(EMPTY_FIELD, "'chosen' and 'rejected' share no first message: no prompt to extract")
        prompt = _parse_messages(prompt, "prompt")
        return Preference(prompt, _parse_messages(chosen, "chosen"), _parse_messages(rejected, "rejected"), tools)
    raise InvalidRecord(
        WRONG_TYPE,
        f"'chosen' ({type(chosen).__name__}) and 'rejected' ({type(rejected).__name__}) must both be strings or "
        "both be lists of messages",
    )


def extract_prompt(chosen, rejected):
    """(prompt, chosen, rejected) of an implicit-prompt pair, TRL's ``extract_prompt`` rule: the
    prompt is the longest shared beginning (messages, or characters of strings, then less a space
    it ends with); if one is a beginning of the other, all but the last shared element. Unlike
    TRL, a first element that already differs gives an empty prompt (TRL would look at index -1).
    ``("Q: hi A: yes", "Q: hi A: no")`` -> ``("Q: hi A:", " yes", " no")``."""
    idx = 0
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            if idx > 0 and chosen[idx - 1] == " ":
                idx -= 1
            break
    return chosen[:idx], chosen[idx:], rejected[idx:]


def _present(value: Any) -> bool:
    return value is not MISSING and value is not None


def _parse_auto(get: Callable[[str], Any]) -> Any:
    """The row's own format: preference, else messages, else prompt/completion, else text (see
    the module doc)."""
    if _present(get("chosen")) or _present(get("rejected")):
        return _parse_preference(get)  # names the half that is missing
    if _present(get("messages")):
        return _parse_conversation(get)
    if _present(get("prompt")) or _present(get("completion")):
        if _present(get("text")) and not (_present(get("prompt")) and _present(get("completion"))):
            return _parse_text(get)
        return _parse_prompt_completion(get)  # names the half that is missing
    if _present(get("text")):
        return _parse_text(get)
    for key in ("messages", "prompt", "completion", "text"):
        if get(key) is None:
            raise InvalidRecord(EMPTY_FIELD, f"{key!r} is null")
    keys = sorted(get.keys()) if hasattr(get, "keys") else []
    shown = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
    raise InvalidRecord(
        MISSING_FIELD, f"no 'messages', 'prompt'/'completion' or 'text' field (the row has {shown or 'no fields'})"
    )


RECORD_PARSERS: dict[str, Callable[[Callable[[str], Any]], Any]] = {
    "auto": _parse_auto,
    "text": _parse_text,
    "prompt_completion": _parse_prompt_completion,
    "messages": _parse_conversation,
    "preference": _parse_preference,
}


def record_format(record: Any) -> str:
    """The format name of a parsed record (``str`` -> text, ...)."""
    if isinstance(record, str):
        return "text"
    if isinstance(record, Preference):
        return "preference"
    return "prompt_completion" if isinstance(record, PromptCompletion) else "messages"


def _nonblank_str(value: Any, name: str) -> str:
    if value is MISSING:
        raise InvalidRecord(MISSING_FIELD, f"no {name!r} field")
    if value is None:
        raise InvalidRecord(EMPTY_FIELD, f"{name!r} is null")
    if not isinstance(value, str):
        raise InvalidRecord(WRONG_TYPE, f"{name!r} is a {type(value).__name__}, expected a string")
    if not value or value.isspace():
        raise InvalidRecord(EMPTY_FIELD, f"{name!r} is empty")
    return value


def _parse_messages(messages: list[Any], name: str) -> list[dict[str, Any]]:
    """Validate messages; return them without null keys and with text content joined (a new
    dict for a message that changes; one that does not is returned as it is)."""
    if not messages:
        raise InvalidRecord(EMPTY_FIELD, f"{name!r} is an empty list")
    out = []
    for i, message in enumerate(messages):
        # The common message, {"role": known, "content": str, no null}, is already what the
        # checks below return (a dict parsed for this row, owned by nobody else): kept as it is.
        if (type(message) is dict and type(message.get("content")) is str and message.get("role") in MESSAGE_ROLES
                and None not in message.values()):  # fmt: skip
            out.append(message)
            continue
        where = f"{name}[{i}]"
        if not isinstance(message, dict):
            raise InvalidRecord(WRONG_TYPE, f"{where} is a {type(message).__name__}, expected an object")
        m = {k: v for k, v in message.items() if v is not None}
        role = m.get("role", MISSING)
        if role is MISSING:
            raise InvalidRecord(MISSING_FIELD, f"{where} has no 'role'")
        if not isinstance(role, str):
            raise InvalidRecord(WRONG_TYPE, f"{where}.role is a {type(role).__name__}, expected a string")
        if role not in MESSAGE_ROLES:
            raise InvalidRecord(UNKNOWN_ROLE, f"{where}.role is {role[:40]!r}; allowed: {', '.join(MESSAGE_ROLES)}")
        content = m.get("content", MISSING)
        if content is MISSING:
            if "tool_calls" not in m:
                raise InvalidRecord(MISSING_FIELD, f"{where} has no 'content' (nor 'tool_calls')")
        elif isinstance(content, list):
            m["content"] = _join_text_parts(content, where)
        elif not isinstance(content, str):
            raise InvalidRecord(WRONG_TYPE, f"{where}.content is a {type(content).__name__}, expected a string or parts")
        out.append(m)
    return out


def _join_text_parts(parts: list[Any], where: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise InvalidRecord(WRONG_TYPE, f"{where}.content[{j}] is a {type(part).__name__}, expected an object")
        kind = part.get("type")
        if kind != "text":
            raise InvalidRecord(UNSUPPORTED_CONTENT, f"{where}.content[{j}] has type {kind!r}; only text parts are supported")
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRecord(WRONG_TYPE, f"{where}.content[{j}].text is a {type(text).__name__}, expected a string")
        texts.append(text)
    return "".join(texts)


def _parse_tools(tools: Any) -> list[Any] | None:
    if tools is MISSING or tools is None:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            raise InvalidRecord(WRONG_TYPE, "'tools' is a string that is not JSON") from None
    if not isinstance(tools, list):
        raise InvalidRecord(WRONG_TYPE, f"'tools' is a {type(tools).__name__}, expected a list of tool schemas")
    return tools or None
