"""Preference rows: detected per row among the other formats, the implicit prompt extracted,
and every malformed pair skipped with its reason."""

from __future__ import annotations

import pytest

from packfeed.service.inputs.records import (
    MISSING,
    RECORD_PARSERS,
    Conversation,
    InvalidRecord,
    Preference,
    PromptCompletion,
    extract_prompt,
    record_format,
)

U = {"role": "user", "content": "hi"}
A = {"role": "assistant", "content": "hello"}
B = {"role": "assistant", "content": "go away"}


def parse(row: dict, fmt: str = "auto"):
    return RECORD_PARSERS[fmt](lambda key: row.get(key, MISSING))


DETECTED = [
    pytest.param({"prompt": "Q:", "chosen": " yes", "rejected": " no"}, Preference("Q:", " yes", " no"), id="standard"),
    pytest.param({"prompt": [U], "chosen": [A], "rejected": [B]}, Preference([U], [A], [B]), id="conversational"),
    pytest.param({"chosen": "Q: sky? A: blue", "rejected": "Q: sky? A: red"},
                 Preference("Q: sky? A:", " blue", " red"), id="implicit-standard-space-goes-to-answers"),
    pytest.param({"chosen": [U, A], "rejected": [U, B]}, Preference([U], [A], [B]), id="implicit-conversational"),
    pytest.param({"prompt": "hi", "chosen": [U, A], "rejected": [U, B]}, Preference([U], [A], [B]),
                 id="string-prompt-beside-conversations-ignored-as-trl"),
    pytest.param({"prompt": "", "chosen": "yes", "rejected": "no"}, Preference("", "yes", "no"), id="empty-prompt"),
    pytest.param({"chosen": "yes", "rejected": "no", "tools": "[]"}, Preference("", "yes", "no"), id="no-shared-text"),
    pytest.param({"chosen": "same", "rejected": "same"}, Preference("sam", "e", "e"), id="identical-as-trl-extracts"),
    pytest.param({"messages": [U, A]}, Conversation([U, A]), id="messages-still-messages"),
    pytest.param({"prompt": "a", "completion": "b"}, PromptCompletion("a", "b"), id="prompt-completion-still"),
    pytest.param({"text": "a", "chosen": None}, "a", id="null-chosen-is-absent"),
]


@pytest.mark.parametrize("row, want", DETECTED)
def test_detected_per_row(row, want):
    got = parse(row)
    assert got == want
    if isinstance(want, Preference):
        assert record_format(got) == "preference" and parse(row, "preference") == want


REFUSED = [
    pytest.param({"prompt": "Q", "chosen": "yes"}, "missing_field", "no 'rejected' field", id="no-rejected"),
    pytest.param({"rejected": "no", "text": "x"}, "missing_field", "no 'chosen' field", id="no-chosen-beside-text"),
    pytest.param({"chosen": "yes", "rejected": None}, "empty_field", "'rejected' is null", id="null-rejected"),
    pytest.param({"prompt": "Q", "chosen": "  ", "rejected": "no"}, "empty_field", "'chosen' is empty", id="blank"),
    pytest.param({"chosen": "yes", "rejected": [A]}, "wrong_type", "must both be strings", id="mixed-types"),
    pytest.param({"prompt": [U], "chosen": "yes", "rejected": "no"}, "wrong_type", "'prompt' is a list",
                 id="list-prompt-string-answers"),
    pytest.param({"chosen": [A], "rejected": [B]}, "empty_field", "share no first message", id="no-shared-message"),
    pytest.param({"prompt": [U], "chosen": [], "rejected": [B]}, "empty_field", "'chosen' is an empty list",
                 id="empty-answer-list"),
    pytest.param({"prompt": [U], "chosen": [{"role": "bot", "content": "x"}], "rejected": [B]}, "unknown_role",
                 "chosen[0].role", id="unknown-role"),
]


@pytest.mark.parametrize("row, reason, detail", REFUSED)
def test_refused_with_reason(row, reason, detail):
    with pytest.raises(InvalidRecord) as e:
        parse(row)
    assert e.value.reason == reason and detail in e.value.detail


@pytest.mark.parametrize("chosen, rejected, want", [
    ("abc", "abd", ("ab", "c", "d")),
    ("a b", "a c", ("a", " b", " c")),
    ("x", "y", ("", "x", "y")),
    ("hello world", "hello", ("hell", "o world", "o")),  # TRL: one a beginning of the other
    (["m1", "m2"], ["m1", "m3"], (["m1"], ["m2"], ["m3"])),
])
def test_extract_prompt_golden(chosen, rejected, want):
    assert extract_prompt(chosen, rejected) == want
