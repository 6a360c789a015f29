"""User errors versus bugs, for every packfeed command.

Rule: a mistake the user can fix (a bad flag or config value, a missing or unreadable input, a
corrupt file, a bad sample under --strict, an unreachable cluster) is ONE line naming the
input and the fix, and exit status 2; a bug keeps its traceback (exit 1). ``--debug`` shows
the traceback of a user error too.

Convention: code that finds a user mistake raises ``ValueError`` (or lets an ``OSError``, which
names its file, through) with a message that says what to do. Ray wraps exceptions raised in
actors and tasks; ``root_cause`` unwraps them to what the data or the config raised.
"""

from __future__ import annotations

USER_ERROR_EXIT = 2


def root_cause(exc: BaseException) -> BaseException:
    """Unwrap Ray's task errors (``.cause``), Ray Train's worker group errors (the lowest rank's
    failure) and exception chains to the original exception."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) or exc.__cause__
        failures = getattr(exc, "worker_failures", None)  # ray.train WorkerGroupError: rank -> error
        if inner is None and isinstance(failures, dict) and failures:
            inner = failures[min(failures)]
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def user_message(exc: BaseException) -> str | None:
    """The one-line message of a user error, or None when ``exc`` is a bug."""
    cause = root_cause(exc)
    if isinstance(cause, (ValueError, OSError)) and not _is_internal(cause):
        text = str(cause).strip() or type(cause).__name__
        return " ".join(text.split())  # one line
    return None


def _is_internal(exc: BaseException) -> bool:
    """Errors of Ray's own classes (a lost worker, a timeout inside Ray) are not the user's."""
    return type(exc).__module__.split(".")[0] == "ray"
