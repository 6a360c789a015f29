"""Storage: every path a URI (local, s3://, gs://, abfs://, hdfs://, any fsspec protocol).

uri.py resolves a URI to a pyarrow filesystem and a path; redact.py keeps credentials out of
every message; objects.py stats, lists a prefix, writes atomically and deletes by prefix;
glob.py expands globs with one meaning on disk and on a store (a store listed once, through
objects.py's listing); reads.py reads by byte range (coalesced, checked against the plan's
version); retry.py retries transient failures of remote requests for a budget of time
(backoff.py: the policy and its schedule; limiter.py: fewer requests in flight while a store
throttles) and counts requests, retries, throttled answers and bytes per process;
store_errors.py makes every failure one line.
"""

from packfeed.service.storage.store_errors import StorageError
from packfeed.service.storage.glob import expand, has_magic, local_glob, match
from packfeed.service.storage.objects import (
    ObjectInfo,
    check_unchanged,
    delete_prefix,
    exists,
    listing,
    stat,
    write_bytes_atomic,
)
from packfeed.service.storage.reads import RangeReader, coalesce, open_input, read_bytes, read_range, read_ranges
from packfeed.service.storage.redact import display, scrub
from packfeed.service.storage.retry import COUNTERS, RetryPolicy, StorageCounts, current_policy, set_policy
from packfeed.service.storage.uri import is_remote, join, resolve, scheme_of

__all__ = [
    "COUNTERS", "ObjectInfo", "RangeReader", "RetryPolicy", "StorageCounts", "StorageError",
    "check_unchanged", "coalesce", "current_policy", "delete_prefix", "display", "exists", "expand",
    "has_magic", "is_remote", "join", "listing", "local_glob", "match", "open_input", "read_bytes",
    "read_range", "read_ranges", "resolve", "scheme_of", "scrub", "set_policy", "stat", "write_bytes_atomic",
]
