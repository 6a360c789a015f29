"""JSONL records decoded straight into their format's shape: msgspec checks the types while it
decodes, and a few string checks finish the validation; what it refuses goes the general way.

``TYPED_DECODERS[format](line)`` returns the record records.py's parser would return for the
line (the same ``str``, ``Conversation``, ``PromptCompletion`` or ``Preference``, equal field by
field), or ``None``: the line is not one of the shapes below, and read.py then decodes it as
any JSON (msgspec, ``json.loads`` for what msgspec refuses) and hands it to the parser. So a
record is never one the parser would refuse, and every skip keeps the parser's reason and
detail. Shapes taken (other fields of the object are ignored, as the parsers ignore them):

- ``text``: ``{"text": "..."}`` with a non-whitespace character;
- ``messages``: a non-empty list of messages whose values are all strings, each with a known
  ``role`` and a ``content`` (the common message; the list is the record's, as decoded);
- ``prompt_completion``: both strings, the completion not blank;
- ``preference``: ``chosen`` and ``rejected`` strings, ``prompt`` a string or absent (then
  extracted, as the parser extracts it), the answers not blank;
- ``auto``: any of those, picked by the parser's rule (``records._parse_auto``).

``tools`` must be absent or null. Anything else (a null or non-string field, conversational
prompt/completion or pairs, a message with a null, a list content or ``tool_calls``, a blank
answer, a BOM) is refused. msgspec skips the ignored fields without checking that their strings
are UTF-8 (the general way skips such a line as ``invalid_utf8``), so only an ASCII line may
hold other fields; a line that is not ASCII is taken only when it holds no other field.
bench/bench_read.py measures it against the general way on the same lines.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import msgspec
from msgspec import UNSET, Struct, UnsetType

from packfeed.service.inputs.records import (
    MESSAGE_ROLES,
    Conversation,
    Preference,
    PromptCompletion,
    extract_prompt,
)

_Messages = list[dict[str, str]]  # every value a string: no null, no parts, no tool_calls list


class _Text(Struct):
    text: str


class _Conversation(Struct):
    messages: _Messages
    tools: None = None


class _PromptCompletion(Struct):
    prompt: str
    completion: str
    tools: None = None


class _Preference(Struct):
    chosen: str
    rejected: str
    prompt: Union[str, UnsetType] = UNSET
    tools: None = None


class _Auto(Struct):
    text: Union[str, UnsetType] = UNSET
    messages: Union[_Messages, UnsetType] = UNSET
    prompt: Union[str, UnsetType] = UNSET
    completion: Union[str, UnsetType] = UNSET
    chosen: Union[str, UnsetType] = UNSET
    rejected: Union[str, UnsetType] = UNSET
    tools: None = None


def _blank(value: str) -> bool:
    return not value or value.isspace()


def _text(text: str) -> str | None:
    return None if _blank(text) else text


def _conversation(messages: _Messages) -> Conversation | None:
    if not messages:
        return None
    for m in messages:
        if m.get("role") not in MESSAGE_ROLES or "content" not in m:
            return None
    return Conversation(messages, None)


def _prompt_completion(prompt: str, completion: str) -> PromptCompletion | None:
    return None if _blank(completion) else PromptCompletion(prompt, completion, None)


def _preference(prompt: str | UnsetType, chosen: str, rejected: str) -> Preference | None:
    if prompt is UNSET:
        prompt, chosen, rejected = extract_prompt(chosen, rejected)
    return None if _blank(chosen) or _blank(rejected) else Preference(prompt, chosen, rejected, None)


def _auto(r: _Auto) -> Any:
    """records._parse_auto's choice on a typed record; None where the parser would look further
    or refuse."""
    if r.chosen is not UNSET or r.rejected is not UNSET:
        if r.chosen is UNSET or r.rejected is UNSET:
            return None
        return _preference(r.prompt, r.chosen, r.rejected)
    if r.messages is not UNSET:
        return _conversation(r.messages)
    has_prompt, has_completion = r.prompt is not UNSET, r.completion is not UNSET
    if has_prompt or has_completion:
        if r.text is not UNSET and not (has_prompt and has_completion):
            return _text(r.text)
        return _prompt_completion(r.prompt, r.completion) if has_prompt and has_completion else None
    return None if r.text is UNSET else _text(r.text)


def _typed(struct: type, finish: Callable[[Any], Any]) -> Callable[[bytes], Any]:
    """The typed decoder of ``struct``'s shape: an ASCII line as the struct (its other fields
    skipped), any other line as the struct with no other field (msgspec decodes every string of
    it, so each is checked to be UTF-8); ``finish`` checks the strings and builds the record."""
    lenient = msgspec.json.Decoder(struct).decode
    strict = msgspec.json.Decoder(msgspec.defstruct(struct.__name__, [], bases=(struct,),
                                                    forbid_unknown_fields=True)).decode

    def record(line: bytes) -> Any:
        try:
            typed = (lenient if line.isascii() else strict)(line)
        except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
            return None
        return finish(typed)

    return record


TYPED_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "auto": _typed(_Auto, _auto),
    "text": _typed(_Text, lambda r: _text(r.text)),
    "messages": _typed(_Conversation, lambda r: _conversation(r.messages)),
    "prompt_completion": _typed(_PromptCompletion, lambda r: _prompt_completion(r.prompt, r.completion)),
    "preference": _typed(_Preference, lambda r: _preference(r.prompt, r.chosen, r.rejected)),
}
