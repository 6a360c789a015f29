"""User errors versus bugs, for every packfeed command.

Rule: a mistake the user can fix (a bad flag or config value, a missing or unreadable input, a
corrupt file, a bad sample under --strict, an unreachable cluster) is ONE line naming the
input and the fix, and exit status 2; a bug keeps its traceback (exit 1). ``--debug`` shows
the traceback of a user error too.

Convention: code that finds a user mistake raises ``ValueError`` (or lets an ``OSError``, which
names its file, through) with a message that says what to do. Ray wraps exceptions raised in
actors and tasks; ``root_cause`` unwraps them to what the data or the config raised. A fault
drill's ``FaultInjected`` (faults.py) is one line too: the drill is the cause.
"""

from __future__ import annotations

import re

from packfeed.service.faults import FAULTS_ENV, FaultInjected

USER_ERROR_EXIT = 2
# What Ray Data appends to the message of an exception a map task raised ("Failed to apply UDF
# transform after 1/1 attempts ...", then how to configure its retries): not the user's fix.
RAY_DATA_RETRY_NOTE = re.compile(r"\nFailed to .{1,200}? after \d+/\d+ attempts \(total backoff [0-9.]+s\)\..*\Z", re.S)


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
    text = RAY_DATA_RETRY_NOTE.sub("", str(cause)).strip() or type(cause).__name__
    if isinstance(cause, FaultInjected):  # a drill asked for it: what fired is the whole story
        return f"{text}: a drill, not a bug (unset ${FAULTS_ENV} for a real run)"
    if isinstance(cause, (ValueError, OSError)) and not _is_internal(cause):
        return " ".join(text.split())  # one line
    return None


def _is_internal(exc: BaseException) -> bool:
    """Errors of Ray's own classes (a lost worker, a timeout inside Ray) are not the user's."""
    return type(exc).__module__.split(".")[0] == "ray"
