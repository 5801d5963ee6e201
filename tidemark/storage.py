"""Where tables live, and how every client reaches an object store with exclusive commits.

Every fence Tidemark has is a Delta commit that exactly one writer wins: the ledger claim,
the target's ``txnAppId`` commit, maintenance against ingest. Local disks, HDFS, ABFS
(atomic rename) and GCS (generation preconditions) give that through Delta's own log
stores. S3 does not: Delta's default ``S3SingleDriverLogStore`` checks that a commit file
is absent, then writes it, and excludes only writers inside one JVM, so two drivers can
both "win" one version and one's rows vanish from the log. Tidemark's sessions therefore
commit to ``s3a://`` through :data:`S3_LOG_STORE` (a ``PUT`` with ``If-None-Match: *``, see
its class), delta-rs commits with the same condition (``AWS_CONDITIONAL_PUT=etag``), and a
session that would commit to S3 through any other store is refused
(:func:`require_exclusive_commits`).

This module holds no server and starts no JVM: it turns :class:`~tidemark.settings.Settings`
into the options Spark (S3A) and delta-rs take, and checks the endpoint answers.
"""

from __future__ import annotations

import configparser
import os
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from tidemark.errors import ConfigError, ServiceUnavailableError
from tidemark.settings import Settings, settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: URL schemes of S3 paths. ``s3`` is mapped to S3A too, so both commit through one store.
S3_SCHEMES = ("s3a", "s3")
#: Tidemark's log store for S3 (``infra/java/io/tidemark/delta/S3ConditionalLogStore.java``).
S3_LOG_STORE = "io.tidemark.delta.S3ConditionalLogStore"
#: Delta's store for several writers on S3 through a DynamoDB table: also exclusive, the user's choice.
DYNAMODB_LOG_STORE = "io.delta.storage.S3DynamoDBLogStore"
#: Where the embedded server's credentials are written, under the stack's home.
EMBEDDED_CREDENTIALS = Path("stack") / "s3" / "credentials"
#: Seconds the endpoint check waits: a stopped endpoint is one line well within 10 s.
REACH_SECONDS = 3.0


def scheme(path: str) -> str:
    """The URL scheme of a table path (``file`` for a plain path)."""
    parsed = urlparse(path)
    return parsed.scheme.lower() if len(parsed.scheme) > 1 else "file"  # a Windows drive letter is not a scheme


def on_s3(path: str) -> bool:
    return scheme(path) in S3_SCHEMES


@dataclass(frozen=True)
class S3Access:
    """An S3 endpoint and the credentials for it, resolved from the settings (secret hidden in repr)."""

    endpoint: str | None
    """None: AWS's own endpoint for :attr:`region`."""
    region: str
    path_style: bool
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    source: str = "the AWS default chain"
    """Where the credentials came from, for messages."""
    embedded: bool = False
    """The embedded server's (``TIDEMARK_STORAGE=s3`` with no endpoint)."""

    @property
    def url(self) -> str:
        return self.endpoint or f"https://s3.{self.region}.amazonaws.com"

    @property
    def setting(self) -> str:
        """The setting that names :attr:`url`."""
        return "TIDEMARK_S3__PORT" if self.embedded else "TIDEMARK_S3__ENDPOINT"

    def spark_conf(self) -> dict[str, str]:
        """S3A's settings and Tidemark's log store, as Spark session settings."""
        conf = {
            "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            "spark.hadoop.fs.s3a.path.style.access": str(self.path_style).lower(),
            # S3A's switch for If-None-Match (on by default); Tidemark's store asks for it by name.
            "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
            **{f"spark.delta.logStore.{s}.impl": S3_LOG_STORE for s in S3_SCHEMES},
        }
        if self.endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https")).lower()
        if self.access_key_id and self.secret_access_key:
            conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = \
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            conf["spark.hadoop.fs.s3a.access.key"] = self.access_key_id
            conf["spark.hadoop.fs.s3a.secret.key"] = self.secret_access_key
        return conf

    def delta_rs_options(self) -> dict[str, str]:
        """delta-rs (object_store) options: the same endpoint and credentials, commits conditional."""
        options = {"AWS_REGION": self.region, "AWS_CONDITIONAL_PUT": "etag",
                   "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not self.path_style).lower()}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            if self.endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        if self.access_key_id and self.secret_access_key:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        return options


def tables_root(s: Settings, *parts: str) -> str:
    """Where Tidemark's own tables (the demo's, the smoke check's) go: the S3 bucket with
    ``TIDEMARK_STORAGE=s3``, else under the home directory."""
    if s.storage == "s3":
        return "/".join([f"s3a://{s.s3.bucket}", *parts])
    return str(s.home_dir.joinpath(*parts))


def embedded_endpoint(s: Settings) -> str:
    return f"http://127.0.0.1:{s.s3.port}"


def s3_access(s: Settings | None = None, *, strict: bool = True) -> S3Access:
    """The S3 endpoint and credentials the settings name.

    Credentials, first found: ``TIDEMARK_S3__ACCESS_KEY_ID`` with ``TIDEMARK_S3__SECRET_ACCESS_KEY``;
    ``TIDEMARK_S3__CREDENTIALS_FILE``; the embedded server's file (``TIDEMARK_STORAGE=s3``, no
    endpoint); else none, and S3A and delta-rs use the AWS default chain.
    """
    s = s or settings()
    c = s.s3
    embedded = s.storage == "s3" and c.endpoint is None
    endpoint = embedded_endpoint(s) if embedded else c.endpoint
    base = S3Access(endpoint, c.region, c.path_style, embedded=embedded)
    if c.access_key_id or c.secret_access_key:
        if not (c.access_key_id and c.secret_access_key):
            raise ConfigError("give both TIDEMARK_S3__ACCESS_KEY_ID and TIDEMARK_S3__SECRET_ACCESS_KEY, or neither")
        return replace(base, access_key_id=c.access_key_id, secret_access_key=c.secret_access_key.get_secret_value(),
                       source="TIDEMARK_S3__ACCESS_KEY_ID")
    if c.credentials_file is not None:
        return _from_file(base, c.credentials_file.expanduser(), "TIDEMARK_S3__CREDENTIALS_FILE")
    if embedded:
        path = s.home_dir / EMBEDDED_CREDENTIALS
        if not path.exists():
            if not strict:
                return base
            raise ConfigError(f"the embedded S3 server's credentials ({path}) do not exist yet: "
                              "run `tidemark stack up` with TIDEMARK_STORAGE=s3 first")
        return _from_file(base, path, "the embedded S3 server", profile="default")  # its own file, whatever AWS_PROFILE says
    return base


def _from_file(base: S3Access, path: Path, setting: str, *, profile: str | None = None) -> S3Access:
    key, secret = read_credentials(path, setting, profile=profile)
    return replace(base, access_key_id=key, secret_access_key=secret, source=str(path))


def read_credentials(path: Path, setting: str, *, profile: str | None = None) -> tuple[str, str]:
    """(access key id, secret) from an AWS shared-credentials file: section ``profile``, else
    ``AWS_PROFILE``'s, else ``[default]``. ``setting`` names where the path came from, for messages."""
    parser = configparser.ConfigParser()
    try:
        parser.read_string(path.read_text())
    except (OSError, configparser.Error) as exc:
        raise ConfigError(f"{setting}: cannot read AWS credentials from {path} ({exc}); fix the file or the path") \
            from None
    profile = profile or os.environ.get("AWS_PROFILE", "default")
    section = parser[profile] if parser.has_section(profile) else None
    key, secret = (section.get("aws_access_key_id"), section.get("aws_secret_access_key")) if section else (None, None)
    if not (key and secret):
        raise ConfigError(f"{setting}: {path} has no [{profile}] with aws_access_key_id and aws_secret_access_key")
    return key, secret


def write_credentials(path: Path, access_key_id: str, secret_access_key: str) -> None:
    """An AWS shared-credentials file readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"[default]\naws_access_key_id = {access_key_id}\naws_secret_access_key = {secret_access_key}\n")


def arrow_filesystem(path: str) -> tuple[Any, str]:
    """A pyarrow file system for ``path`` and the path within it (``s3a://b/k`` is ``b/k`` on S3)."""
    import pyarrow.fs as pafs

    if on_s3(path):
        require_s3_enabled([path])
        a = s3_access()
        endpoint = urlparse(a.endpoint) if a.endpoint else None
        fs = pafs.S3FileSystem(access_key=a.access_key_id, secret_key=a.secret_access_key, region=a.region,
                               endpoint_override=endpoint.netloc if endpoint else None,
                               scheme=endpoint.scheme if endpoint else "https",
                               force_virtual_addressing=not a.path_style)
        return fs, path.split("://", 1)[1]
    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return pafs.FileSystem.from_uri(path)


def delta_rs_options(path: str) -> dict[str, str] | None:
    """``storage_options`` for delta-rs at ``path``: None for a path Delta's defaults serve."""
    if not on_s3(path):
        return None
    require_s3_enabled([path])
    return s3_access().delta_rs_options()


def require_s3_enabled(paths: Iterable[str], s: Settings | None = None) -> None:
    """A table on S3 needs ``TIDEMARK_STORAGE=s3``: it loads S3A and Tidemark's store into Spark."""
    s = s or settings()
    on = [p for p in paths if on_s3(p)]
    if on and s.storage != "s3":
        raise ConfigError(f"table {on[0]} is on S3, but TIDEMARK_STORAGE is {s.storage!r}: set TIDEMARK_STORAGE=s3 "
                          "(and TIDEMARK_S3__ENDPOINT for a server of your own; docs/object-storage.md)")


def check_reachable(paths: Iterable[str], s: Settings | None = None) -> None:
    """Raise :class:`ServiceUnavailableError` at once, naming the address and its setting, if the S3
    endpoint of ``paths`` does not answer; S3A would otherwise retry a refused connection for minutes."""
    paths = [p for p in paths if on_s3(p)]
    if not paths:
        return
    s = s or settings()
    require_s3_enabled(paths, s)
    access = s3_access(s, strict=False)
    try:
        with urllib.request.urlopen(urllib.request.Request(access.url, method="HEAD"), timeout=REACH_SECONDS):
            pass
    except urllib.error.HTTPError:
        pass  # it answered (403 to an anonymous request is an answer)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):  # nothing listens: not running
            hint = ("start the embedded server: `tidemark stack up` (with TIDEMARK_STORAGE=s3)" if access.embedded
                    else f"check {access.setting} and that the server runs")
            raise ServiceUnavailableError(f"the S3 endpoint {access.url} ({access.setting}) refuses connections: "
                                          f"no server runs there; {hint}") from None
        # Connected, or tried to, and no answer came: a server that runs but is stuck or slow.
        raise ServiceUnavailableError(f"the S3 endpoint {access.url} ({access.setting}) did not answer within "
                                      f"{REACH_SECONDS:.0f} s ({reason}): its server is stuck, overloaded or "
                                      "unreachable") from None
    s3_access(s)  # the credentials can be found


def require_exclusive_commits(spark: SparkSession, paths: Iterable[str]) -> None:
    """Refuse to commit to an S3 table through a log store that lets two drivers win one version.

    Delta picks ``spark.delta.logStore.<scheme>.impl``, else ``spark.delta.logStore.class``,
    else ``S3SingleDriverLogStore`` for ``s3a://``: only Tidemark's store and Delta's DynamoDB
    store make a commit exclusive across processes.
    """
    for path in paths:
        s = scheme(path)
        if s not in S3_SCHEMES:
            continue
        key = f"spark.delta.logStore.{s}.impl"
        store = spark.conf.get(key, None) or spark.conf.get("spark.delta.logStore.class", None) \
            or "io.delta.storage.S3SingleDriverLogStore"
        if store not in (S3_LOG_STORE, DYNAMODB_LOG_STORE):
            raise ConfigError(f"table {path}: Delta would commit through {store}, which lets two Spark drivers both "
                              f"commit one version on S3 (rows lost); set {key}={S3_LOG_STORE} (Tidemark's sessions "
                              f"do) or {DYNAMODB_LOG_STORE}")
