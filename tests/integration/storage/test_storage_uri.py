"""URIs: which filesystem serves each, how they join, and how they show without credentials."""

import os

import pyarrow.fs as pafs
import pytest

from packfeed.service.storage import StorageError, display, is_remote, join, resolve, scheme_of, scrub
from packfeed.service.storage.uri import split

pytestmark = pytest.mark.integration

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize("uri, shown", [
    pytest.param(f"s3://AKIAEXAMPLE:{SECRET}@bucket/a.jsonl", "s3://bucket/a.jsonl", id="s3-key-secret"),
    pytest.param("s3://AKIAEXAMPLE@bucket/a.jsonl", "s3://bucket/a.jsonl", id="s3-key-alone"),
    pytest.param(f"gs://tok:{SECRET}@bucket/x", "gs://bucket/x", id="gs-userinfo"),
    pytest.param(f"hdfs://alice:{SECRET}@namenode:8020/data", "hdfs://alice@namenode:8020/data", id="hdfs-password"),
    pytest.param("hdfs://alice@namenode:8020/data", "hdfs://alice@namenode:8020/data", id="hdfs-user-kept"),
    pytest.param("abfss://container@acct.dfs.core.windows.net/p", "abfss://container@acct.dfs.core.windows.net/p",
                 id="abfs-container-kept"),
    pytest.param(f"https://h.example/x.jsonl?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F2024&X-Amz-Signature={SECRET}",
                 "https://h.example/x.jsonl?X-Amz-Algorithm=AWS4&X-Amz-Credential=***&X-Amz-Signature=***",
                 id="presigned-s3"),
    pytest.param(f"https://acct.blob.core.windows.net/c/x?sv=2022&sp=r&sig={SECRET}",
                 "https://acct.blob.core.windows.net/c/x?sv=2022&sp=r&sig=***", id="azure-sas"),
    pytest.param(f"s3://bucket/k?region=eu-west-1&secret_key={SECRET}&access_key=AKIA",
                 "s3://bucket/k?region=eu-west-1&secret_key=***&access_key=***", id="arrow-query"),
    pytest.param(f"https://u:{SECRET}@host/p?token={SECRET}", "https://u@host/p?token=***", id="https-both"),
    pytest.param("s3://bucket/part-?.jsonl", "s3://bucket/part-?.jsonl", id="glob-kept"),
    pytest.param("/data/corpus/a.jsonl", "/data/corpus/a.jsonl", id="local-kept"),
    pytest.param("s3://bucket/max-keys=3/keys=1", "s3://bucket/max-keys=3/keys=1", id="lookalike-names-kept"),
    pytest.param("data/key=1/token=a/part.parquet", "data/key=1/token=a/part.parquet", id="hive-partitions-kept"),
    pytest.param("s3://b/lang=en/key=7/x.jsonl", "s3://b/lang=en/key=7/x.jsonl", id="hive-partitions-on-s3-kept"),
])
def test_display_removes_every_credential(uri, shown):
    assert display(uri) == shown
    assert SECRET not in display(uri) and "AKIAEXAMPLE" not in display(uri)
    assert display(display(uri)) == display(uri)


def test_scrub_cleans_uris_quoted_in_a_message():
    text = f"GET https://h/x?X-Amz-Signature={SECRET} failed; retried s3://K:{SECRET}@b/k"
    assert SECRET not in scrub(text)
    assert "https://h/x?X-Amz-Signature=***" in scrub(text) and "s3://b/k" in scrub(text)


@pytest.mark.parametrize("uri, expected", [
    ("data/a.jsonl", ("", "", "data/a.jsonl")),
    ("/abs/a.jsonl", ("", "", "/abs/a.jsonl")),
    ("file:///abs/a.jsonl", ("", "", "/abs/a.jsonl")),
    ("s3://b/k/x.jsonl", ("s3", "b", "k/x.jsonl")),
    ("S3://b/k", ("s3", "b", "k")),
    ("s3://b", ("s3", "b", "")),
    ("s3://K:S@b/k/part-?.jsonl", ("s3", "K:S@b", "k/part-?.jsonl")),
    ("gs://b/a/**/*.parquet", ("gs", "b", "a/**/*.parquet")),
    ("abfss://c@acct.dfs.core.windows.net/p", ("abfss", "c@acct.dfs.core.windows.net", "p")),
])
def test_split(uri, expected):
    assert split(uri) == expected
    assert is_remote(uri) == bool(expected[0])
    assert scheme_of(uri) == expected[0]


@pytest.mark.parametrize("base, parts, joined", [
    ("s3://b", ("run", "x.parquet"), "s3://b/run/x.parquet"),
    ("s3://b/run/", ("/meta/", "stats.json"), "s3://b/run/meta/stats.json"),
    ("s3://b/run", (), "s3://b/run"),
    ("gs://b/a", ("", "c"), "gs://b/a/c"),
    ("out", ("meta", "stats.json"), os.path.join("out", "meta", "stats.json")),
    ("/tmp/out", ("x",), "/tmp/out/x"),
])
def test_join(base, parts, joined):
    assert join(base, *parts) == joined


def test_resolve_local_and_file_uris(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"abc")
    for uri in (str(tmp_path / "a.txt"), f"file://{tmp_path}/a.txt"):
        fs, path = resolve(uri)
        assert isinstance(fs, pafs.LocalFileSystem)
        assert fs.get_file_info(path).size == 3


def test_resolve_s3_is_cached_per_bucket_and_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fs_a, path = resolve("s3://bucket-a/k/x.jsonl")
    assert isinstance(fs_a, pafs.S3FileSystem) and path == "bucket-a/k/x.jsonl"
    assert resolve("s3://bucket-a/other")[0] is fs_a
    assert resolve("s3://bucket-b/k")[0] is not fs_a
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:10")
    assert resolve("s3://bucket-a/k")[0] is not fs_a  # another endpoint, another filesystem
    assert resolve("s3://bucket-a")[1] == "bucket-a"


def test_resolve_other_stores_offline(monkeypatch):
    fs, path = resolve("gs://bucket/a/b.parquet")
    assert isinstance(fs, pafs.GcsFileSystem) and path == "bucket/a/b.parquet"
    fs, path = resolve("abfss://cont@acct.dfs.core.windows.net/p/x.jsonl")
    assert isinstance(fs, pafs.AzureFileSystem) and path == "cont/p/x.jsonl"
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    fs, path = resolve("az://cont/p/x.jsonl")
    assert isinstance(fs, pafs.AzureFileSystem) and path == "cont/p/x.jsonl"
    fs, path = resolve("memory://packfeed-test/x.jsonl")  # any fsspec protocol, through Arrow's wrapper
    assert isinstance(fs, pafs.PyFileSystem) and path == "/packfeed-test/x.jsonl"


@pytest.mark.parametrize("uri, says", [
    pytest.param("nosuchproto://b/k", "unknown protocol 'nosuchproto'", id="unknown-protocol"),
    pytest.param("s3:///k/x.jsonl", "no bucket in the URI", id="no-bucket"),
    pytest.param("s3://bad bucket!/k", "is not a bucket name", id="bad-bucket"),
    pytest.param(f"hdfs://alice:{SECRET}@namenode:8020/p", "cannot open the store", id="hdfs-without-java"),
    pytest.param("az://cont/p", "AZURE_STORAGE_ACCOUNT_NAME", id="azure-without-account"),
])
def test_resolve_errors_are_one_line(uri, says, monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    with pytest.raises(StorageError) as info:
        resolve(uri)
    message = str(info.value)
    assert says in message
    assert "\n" not in message and SECRET not in message and len(message) < 600
    assert message.startswith(display(uri).split("/")[0])
