"""Globs mean the same on disk, on S3 and on any fsspec store; a store is listed once per glob."""

import pytest

from packfeed.service.storage import COUNTERS, StorageError, expand, listing, match
from packfeed.service.storage.store_errors import NO_BUCKET, NO_MATCH

pytestmark = pytest.mark.integration

TREE = [
    "a.jsonl", "b.parquet", "c.txt", ".hidden.jsonl", "part-1.jsonl", "part-2.jsonl", "part-10.jsonl",
    "d1/x.jsonl", "d1/y.jsonl", "d1/.h/z.jsonl", "d1/sub/deep.jsonl", "d1/sub/deeper/q.jsonl",
    "d2/x.jsonl", "d2-x/k.jsonl", "e/f/g/h.arrow", ".git/config.jsonl",
]
PATTERNS = [
    "*", "*.jsonl", "?.jsonl", "[ab].*", "[!a]*.jsonl", "part-?.jsonl", "part-*.jsonl", "part-[0-9].jsonl",
    "d*/x.jsonl", "d?/*.jsonl", "d1/*", "d1/**", "**", "**/*.jsonl", "d1/**/*.jsonl", "**/deep*",
    "d1/**/q.jsonl", ".*", "d1/.h/*", "**/.h/*", "*/*/*.jsonl", "d1/sub/**", "**/x.jsonl", "e/**/h.arrow",
    "*/**/g", "d1/s*/**/*.jsonl", ".git/*", "**/*.arrow", "*-x/*", "d1/sub/deep.*",
]


@pytest.mark.parametrize("pattern, parts, matches", [
    pytest.param(["*.jsonl"], ["a.jsonl"], True, id="star"),
    pytest.param(["*"], [".hidden"], False, id="star-skips-hidden"),
    pytest.param([".*"], [".hidden"], True, id="dot-pattern-matches-hidden"),
    pytest.param(["*"], ["d", "x"], False, id="star-is-one-segment"),
    pytest.param(["**", "x"], ["x"], True, id="globstar-zero-segments"),
    pytest.param(["**", "x"], ["a", "b", "x"], True, id="globstar-many-segments"),
    pytest.param(["**", "x"], [".git", "x"], False, id="globstar-skips-hidden-dir"),
    pytest.param(["?"], ["ab"], False, id="question-one-char"),
    pytest.param(["[ab]"], ["b"], True, id="class"),
    pytest.param(["[!ab]"], ["b"], False, id="negated-class"),
])
def test_match_golden(pattern, parts, matches):
    assert match(pattern, parts) is matches


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("globtree")
    for i, name in enumerate(TREE):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{name}\n".encode() * (i + 1))
    return root


def _relative(found, base):
    return [(info.uri[len(base) + 1:], info.is_dir) for info in found]


def _local(tree, pattern):
    try:
        return _relative(expand(f"{tree}/{pattern}"), str(tree))
    except StorageError as exc:
        return exc.kind


@pytest.fixture
def s3_tree(s3, tree):
    bucket = s3.bucket()
    s3.upload_tree(tree, bucket, "corpus/")
    return f"s3://{bucket}/corpus"


def test_s3_glob_equals_local_glob(s3_tree, tree):
    seen_dirs = seen_hidden = 0
    for pattern in PATTERNS:
        local = _local(tree, pattern)
        assert local != NO_MATCH, f"pattern {pattern!r} should match something on disk"
        remote = _relative(expand(f"{s3_tree}/{pattern}"), s3_tree)
        assert remote == local, pattern
        seen_dirs += any(is_dir for _, is_dir in local)
        seen_hidden += any(name.startswith(".") or "/." in name for name, _ in local)
    assert seen_dirs and seen_hidden  # the sweep met directories and hidden names


def test_fsspec_glob_equals_local_glob(tree):
    import fsspec

    memory = fsspec.filesystem("memory")
    for name in TREE:
        memory.pipe(f"/globtree/{name}", (tree / name).read_bytes())
    base = "memory://globtree"
    for pattern in PATTERNS:
        assert _relative(expand(f"{base}/{pattern}"), base) == _local(tree, pattern), pattern


def test_glob_sizes_and_mtimes_come_from_the_listing(s3_tree, tree):
    for info in expand(f"{s3_tree}/**/*.jsonl"):
        local = tree / info.uri[len(s3_tree) + 1:]
        assert info.size == local.stat().st_size and info.mtime_ns > 0


def test_one_list_request_per_glob(s3_faulty, s3_proxy, tree):
    bucket = s3_faulty.bucket()
    s3_faulty.upload_tree(tree, bucket, "corpus/")
    for pattern in PATTERNS:
        s3_proxy.reset()
        before = COUNTERS.snapshot()
        assert expand(f"s3://{bucket}/corpus/{pattern}")
        assert s3_proxy.count(lists=True) == 1 and s3_proxy.count() == 1, (pattern, s3_proxy.requests)
        assert (COUNTERS.snapshot() - before).requests == 1


def test_listing_a_prefix(s3, tree):
    bucket = s3.bucket()
    s3.upload_tree(tree, bucket, "corpus/")
    flat = [(info.uri, info.is_dir) for info in listing(f"s3://{bucket}/corpus/d1", recursive=False)]
    assert flat == [(f"s3://{bucket}/corpus/d1/.h", True), (f"s3://{bucket}/corpus/d1/sub", True),
                    (f"s3://{bucket}/corpus/d1/x.jsonl", False), (f"s3://{bucket}/corpus/d1/y.jsonl", False)]
    assert listing(f"s3://{bucket}/nothing-here", recursive=True) == []


def test_a_glob_matching_nothing_is_one_line(s3, tree):
    bucket = s3.bucket()
    s3.upload_tree(tree, bucket, "corpus/")
    cases = [
        (f"s3://{bucket}/corpus/*.csv", NO_MATCH, "the glob matches nothing"),
        (f"s3://{bucket}/absent/**/*.jsonl", NO_MATCH, "the glob matches nothing"),
        (f"s3://{bucket}-missing/corpus/*.jsonl", NO_BUCKET, f"the bucket '{bucket}-missing' does not exist"),
        (f"{tree}/*.csv", NO_MATCH, "the glob matches nothing"),
    ]
    for pattern, kind, says in cases:
        with pytest.raises(StorageError) as info:
            expand(pattern)
        assert info.value.kind == kind and str(info.value) == f"{pattern}: {says}"
