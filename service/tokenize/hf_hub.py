"""Hugging Face Hub names and whether the Hub can answer, for every load of a tokenizer, a model
or its config.

A name is a local path or a Hub id (``looks_local``). Left to itself, loading a Hub id on a
machine without the network costs transformers' retries (tens of seconds and a ``Retrying`` line
each) before failing, or loading it from the cache after all. One probe of
the endpoint (``hub_unreachable``) answers in at most ``HUB_PROBE_SECONDS``; when the Hub cannot
answer, loads read the local cache only (``hub_kwargs``), and a name that is not cached is one
line (``hub_unreachable_error``). Standard library only: samples.py, shipped.py and the trainer
import it, and it imports none of them.
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.error
import urllib.request
from typing import Any

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # "gpt2", "Qwen/Qwen2.5-0.5B"


def looks_local(name: str) -> bool:
    """Is ``name`` meant as a local path rather than a Hugging Face id? An existing path, or a
    name a Hub id cannot be: ``./tok``, ``/abs/tok``, ``~/tok``, ``a/b/c``. ``org/name`` is an
    id unless it exists here."""
    return os.path.exists(name) or not _HUB_ID.fullmatch(name)


HUB_PROBE_SECONDS = 3.0  # the Hub's answer to one HEAD from here: ~0.1-0.5 s when it is reachable
HUB_PROBE_KEEP_SECONDS = 60.0  # a process's loads (tokenizer, model config, reference) share one probe
_DEFAULT_ENDPOINT = "https://huggingface.co"
_probes: dict[str, tuple[float, str | None]] = {}


def hub_unreachable(name: str) -> str | None:
    """Why the Hugging Face Hub cannot answer for ``name``, or None: ``name`` is a local
    directory, offline mode is set ($HF_HUB_OFFLINE / $TRANSFORMERS_OFFLINE: transformers then
    reads only the local cache, and fails in ~2 s), or the endpoint ($HF_ENDPOINT, as
    huggingface_hub's) answered one HEAD within ``HUB_PROBE_SECONDS`` (any HTTP status: it is
    there). Without it, a load of a Hub id on a machine without network retried for 49 s
    (tokenizer) or 25 s (a model's config), 20 ``Retrying`` lines, before failing; a cached id
    loaded after the same wait. The answer is kept ``HUB_PROBE_KEEP_SECONDS`` per endpoint;
    the probe honours $HTTPS_PROXY as huggingface_hub does (urllib reads the same variables)."""
    if os.path.isdir(name) or _offline_mode():
        return None
    endpoint = (os.environ.get("HF_ENDPOINT") or _DEFAULT_ENDPOINT).rstrip("/")
    kept = _probes.get(endpoint)
    if kept is None or time.monotonic() - kept[0] > HUB_PROBE_KEEP_SECONDS:
        kept = _probes[endpoint] = (time.monotonic(), _probe(endpoint, HUB_PROBE_SECONDS))
    return kept[1]


def hub_kwargs(name: str) -> dict[str, Any]:
    """``from_pretrained``'s keyword for ``name``: ``local_files_only`` when it is a Hub id and
    the Hub is unreachable (``hub_unreachable``), so a cached id loads at once, offline."""
    return {"local_files_only": True} if hub_unreachable(name) else {}


def hub_unreachable_error(what: str, name: str, why: str, hint: str = "") -> ValueError:
    """The one line for a Hub id that is neither local nor cached while the Hub is unreachable
    (``hint``: after the name, e.g. " (did you mean 'tiny-llama'?)")."""
    return ValueError(f"{what} {name!r}{hint}: not a local directory and the Hugging Face Hub is unreachable "
                      f"({why}), nor is it in the local cache; pass a local path or set HF_HUB_OFFLINE=1 with the "
                      f"{what} cached")


def _offline_mode() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _probe(endpoint: str, timeout: float) -> str | None:
    """None when ``endpoint`` answers an HTTP HEAD within ``timeout`` s, else why not. Run in a
    thread joined with the timeout: a name lookup that hangs is not bounded by the socket's."""
    why: list[str | None] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            why.append(None)
        except urllib.error.HTTPError:  # an HTTP answer, whatever its status: the Hub is there
            why.append(None)
        except Exception as e:  # URLError, a timeout, a malformed $HF_ENDPOINT: said in the one line
            reason = getattr(e, "reason", None) or e
            why.append(f"{endpoint}: {getattr(reason, 'strerror', None) or reason}")

    thread = threading.Thread(target=ask, name="packfeed-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return why[0] if why else f"{endpoint}: no answer within {timeout:g} s"
