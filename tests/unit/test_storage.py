"""``tidemark.storage``: which paths are on S3, where credentials come from, what each client is told,
and which log stores are refused (pure logic; the S3 stage proves the behaviour on a real server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidemark.errors import ConfigError
from tidemark.settings import Settings
from tidemark.storage import (
    S3_LOG_STORE,
    check_reachable,
    delta_rs_options,
    on_s3,
    require_exclusive_commits,
    require_s3_enabled,
    s3_access,
    scheme,
    tables_root,
    write_credentials,
)


def _settings(tmp_path: Path, **s3: Any) -> Settings:
    return Settings(home=tmp_path, storage="s3", s3=s3)


@pytest.mark.parametrize(("path", "expected"), [
    ("s3a://b/t", "s3a"), ("S3://b/t", "s3"), ("/data/t", "file"), ("file:///data/t", "file"),
    ("abfss://c@a.dfs.core.windows.net/t", "abfss"), ("gs://b/t", "gs"), ("C:/data/t", "file")])
def test_scheme_of_a_table_path(path: str, expected: str) -> None:
    assert scheme(path) == expected
    assert on_s3(path) == (expected in ("s3a", "s3"))


def test_the_embedded_server_is_used_with_its_own_credentials_file(tmp_path: Path) -> None:
    s = _settings(tmp_path, port=19123)
    with pytest.raises(ConfigError, match="tidemark stack up"):
        s3_access(s)
    assert s3_access(s, strict=False).access_key_id is None  # a session built before the stack is up
    write_credentials(tmp_path / "stack" / "s3" / "credentials", "AKID", "s3cr3t-value")
    assert (tmp_path / "stack" / "s3" / "credentials").stat().st_mode & 0o777 == 0o600
    access = s3_access(s)
    assert (access.endpoint, access.access_key_id, access.secret_access_key) == \
        ("http://127.0.0.1:19123", "AKID", "s3cr3t-value")
    assert access.embedded and access.setting == "TIDEMARK_S3__PORT"
    assert "s3cr3t-value" not in repr(access)


def test_explicit_keys_then_a_credentials_file_then_the_default_chain(tmp_path: Path) -> None:
    keyed = s3_access(_settings(tmp_path, endpoint="https://s3.example", access_key_id="K", secret_access_key="S"))
    assert (keyed.access_key_id, keyed.secret_access_key, keyed.setting) == ("K", "S", "TIDEMARK_S3__ENDPOINT")
    with pytest.raises(ConfigError, match="both"):
        s3_access(_settings(tmp_path, endpoint="https://s3.example", access_key_id="K"))
    creds = tmp_path / "aws"
    creds.write_text("[default]\naws_access_key_id = F\naws_secret_access_key = G\n")
    filed = s3_access(_settings(tmp_path, endpoint="https://s3.example", credentials_file=creds))
    assert (filed.access_key_id, filed.secret_access_key) == ("F", "G")
    creds.write_text("[other]\naws_access_key_id = F\n")
    with pytest.raises(ConfigError, match=r"no \[default\]"):
        s3_access(_settings(tmp_path, endpoint="https://s3.example", credentials_file=creds))
    chain = s3_access(_settings(tmp_path, endpoint="https://s3.example"))
    assert chain.access_key_id is None and "spark.hadoop.fs.s3a.access.key" not in chain.spark_conf()
    assert "AWS_ACCESS_KEY_ID" not in chain.delta_rs_options()
    aws = s3_access(_settings(tmp_path, endpoint=None, region="eu-west-1").model_copy(update={"storage": "local"}))
    assert aws.url == "https://s3.eu-west-1.amazonaws.com"


def test_every_client_commits_conditionally_to_the_same_endpoint(tmp_path: Path) -> None:
    access = s3_access(_settings(tmp_path, endpoint="http://minio:9000", access_key_id="K", secret_access_key="S"))
    conf = access.spark_conf()
    assert conf["spark.delta.logStore.s3a.impl"] == conf["spark.delta.logStore.s3.impl"] == S3_LOG_STORE
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    options = access.delta_rs_options()
    assert options["AWS_CONDITIONAL_PUT"] == "etag" and options["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert options["AWS_ALLOW_HTTP"] == "true" and options["AWS_SECRET_ACCESS_KEY"] == "S"


def test_tables_root_follows_the_storage(tmp_path: Path) -> None:
    assert tables_root(_settings(tmp_path, bucket="lake"), "demo", "r1") == "s3a://lake/demo/r1"
    assert tables_root(Settings(home=tmp_path), "demo") == str(tmp_path.resolve() / "demo")


def test_a_table_on_s3_needs_s3_storage(tmp_path: Path) -> None:
    local = Settings(home=tmp_path)
    require_s3_enabled(["/data/t", "gs://b/t"], local)
    with pytest.raises(ConfigError, match="TIDEMARK_STORAGE=s3"):
        require_s3_enabled(["/data/t", "s3a://b/t"], local)
    check_reachable(["/data/t"], local)  # nothing on S3: nothing to check
    assert delta_rs_options("/data/t") is None


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Spark:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _Conf(values)


@pytest.mark.parametrize(("conf", "refused"), [
    ({}, True),  # Delta's default: S3SingleDriverLogStore
    ({"spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"}, True),
    ({"spark.delta.logStore.class": "io.delta.storage.HDFSLogStore"}, True),
    ({"spark.delta.logStore.s3a.impl": S3_LOG_STORE}, False),
    ({"spark.delta.logStore.s3a.impl": "io.delta.storage.S3DynamoDBLogStore"}, False),
    ({"spark.delta.logStore.class": S3_LOG_STORE}, False),
])
def test_only_stores_that_make_a_commit_exclusive_are_accepted_for_s3(conf: dict[str, str], refused: bool) -> None:
    spark: Any = _Spark(conf)
    require_exclusive_commits(spark, ["/local/t", "gs://b/t"])  # never refused: Delta's own stores serve them
    if refused:
        with pytest.raises(ConfigError, match="spark.delta.logStore.s3a.impl"):
            require_exclusive_commits(spark, ["s3a://b/t"])
    else:
        require_exclusive_commits(spark, ["s3a://b/t"])
