"""Can this client reach, authenticate to and see the cluster (and the database)? One clear
answer within seconds.

librdkafka retries a refused login or a failed TLS handshake for ever, and a metadata call
that gives up reports only "broker transport failure"; the cause goes to the error
callback. So before a command starts work on a secured cluster it asks for metadata once,
collects what the error callback says, and turns the first real cause into one line that
names it and the setting to fix (:class:`tidemark.errors.KafkaAccessError`), instead of a
hang, a retry loop or a Java stack trace later. Topics the command needs are checked for
``DESCRIBE`` in the same request (an ACL that hides a topic shows as an authorization error).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from tidemark.errors import KafkaAccessError, PostgresAccessError, ServiceUnavailableError

#: What every refusal tells the operator to do: one wording, one place.
GRANT_HINT = ("an ACL is missing. Grant it the ACLs `tidemark acls` prints for this config "
              "(docs/security.md, \"Secured cluster\")")

#: Seconds the metadata request may take: an operator gets the one line within 10 s of the
#: command's start, interpreter and imports included. A cluster that answers at all does so
#: in milliseconds; a TLS handshake in well under a second.
PREFLIGHT_SECONDS = 6.0

#: An address every broker of which refused the connection (a closed port) is reported after
#: this long, without waiting out the whole timeout: long enough for a few reconnects.
REFUSED_SECONDS = 2.0


def check_access(client_config: Mapping[str, Any], topics: Iterable[str] = (), *,
                 timeout: float = PREFLIGHT_SECONDS, named_by: str = "kafka.bootstrap_servers") -> None:
    """Raise :class:`KafkaAccessError` (a terminal cause) or :class:`ServiceUnavailableError`
    (nobody answered) unless the cluster answers metadata for ``topics`` to these credentials.

    ``named_by`` is the setting that gave the address, for the line an unreachable cluster gets."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[Any] = []
    conf: dict[str, Any] = {k: v for k, v in client_config.items() if k != "logger"}
    conf |= {"error_cb": errors.append, "log_level": 0, "reconnect.backoff.max.ms": 1000}
    admin = AdminClient(conf)
    wanted = sorted(set(topics))
    metadata = _metadata(admin, errors, timeout)
    if metadata is None:
        raise _cause(client_config, errors, named_by) from None
    for topic in wanted:
        found = metadata.topics.get(topic)
        if found is None:  # a listing of all topics leaves out those one may not describe: ask for it
            try:
                found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
            except KafkaException:
                continue  # the command meets whatever this was, and reports it
        if found is not None and found.error is not None and found.error.code() == \
                KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise KafkaAccessError(
                f"Kafka principal {_who(client_config)} may not describe topic {topic!r}: {GRANT_HINT}")


def _metadata(admin: Any, errors: list[Any], timeout: float) -> Any:
    """The cluster's metadata, or None once ``timeout`` passed, or once every broker refused
    the connection for :data:`REFUSED_SECONDS` (the error callback says so early)."""
    import time

    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while True:
        left = deadline - time.monotonic()
        try:
            return admin.list_topics(timeout=max(0.1, min(0.5, left)))
        except KafkaException:
            admin.poll(0.05)  # serves the error callback: the cause
        # A refused login or a failed handshake is retried by librdkafka too, and a loaded broker's
        # handshake can fail once and then pass: those wait out the timeout, and are named.
        if time.monotonic() >= deadline or (_refused(errors) and time.monotonic() - started >= REFUSED_SECONDS):
            return None


def _refused(errors: list[Any]) -> bool:
    """Every broker is down and the cause is a refused TCP connection (nothing listens there).

    Only that: librdkafka also reports all brokers down while a TLS or SASL handshake of a
    loaded broker is slow or fails, and those are waited for, or named by their own error.
    """
    from confluent_kafka import KafkaError

    return any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors) and any(
        e.code() == KafkaError._TRANSPORT and "Connection refused" in e.str() for e in errors)


def require_operation(client_config: Mapping[str, Any], topics: Iterable[str], operation: str, *,
                      role: str = "this", timeout: float = PREFLIGHT_SECONDS) -> None:
    """Raise :class:`KafkaAccessError` if this principal may not ``operation`` (READ, WRITE...) one of ``topics``.

    Asked of the broker itself (a topic description with the caller's authorized
    operations), because what a refused transactional write leaves behind is only
    "purged" delivery reports, the cause going to a log line. A topic that cannot be
    described for another reason is left to the caller's own error handling.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import AclOperation, AdminClient

    admin = AdminClient({k: v for k, v in client_config.items() if k != "logger"} | {"log_level": 0})
    wanted = getattr(AclOperation, operation)
    futures = admin.describe_topics(TopicCollection(list(topics)), include_authorized_operations=True,
                                    request_timeout=timeout)
    for topic, future in futures.items():
        try:
            allowed = future.result().authorized_operations
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
                continue
            allowed = []
        if allowed is not None and wanted not in allowed and AclOperation.ALL not in allowed:
            raise KafkaAccessError(
                f"{role} Kafka principal {_who(client_config)} may not {operation.lower()} topic {topic!r}: {GRANT_HINT}")


def group_refused(err: Any, client_config: Mapping[str, Any]) -> KafkaAccessError | None:
    """The error to stop with if a consumer's ``err`` is its group's authorization failure.

    librdkafka looks up the coordinator of a consumer's group even when the consumer only
    assigns partitions, and hands a refusal to the next ``consume()`` as an error record.
    """
    from confluent_kafka import KafkaError

    if err.code() != KafkaError.GROUP_AUTHORIZATION_FAILED:
        return None
    return KafkaAccessError(
        f"Kafka principal {_who(client_config)} may not use consumer groups starting 'tidemark-' (Read on the "
        f"group, prefixed): {GRANT_HINT}")


#: Kafka's Java client exceptions that mean "refused", as a Spark job that read Kafka reports them.
_JAVA_REFUSALS = ("TopicAuthorizationException", "GroupAuthorizationException", "SaslAuthenticationException",
                  "SslAuthenticationException")

_JAVA_TOPICS = re.compile(r"TopicAuthorizationException: Not authorized to access topics: \[([^\]]*)\]")


def spark_refusal(exc: BaseException, client_config: Mapping[str, Any]) -> KafkaAccessError | None:
    """The error to stop with if ``exc`` (a failed Spark job) is Kafka refusing this principal mid-run.

    The pre-flight check runs before a command starts; an ACL revoked or a password rotated
    while a follower runs shows up inside Spark's Kafka reader instead, as a Java stack
    trace. Only the refusal's own line is kept: the batch it happened in stays claimed and
    unwritten, and the next run, once access is back, writes it (offsets.protocol, step 1).
    """
    text = str(exc)
    kind = next((k for k in _JAVA_REFUSALS if k in text), None)
    if kind is None:
        return None
    then = "the batch in flight was not written; the next run writes it once access is back"
    if kind == "TopicAuthorizationException":
        found = _JAVA_TOPICS.search(text)
        topics = found.group(1) if found else "its topics"
        return KafkaAccessError(f"Kafka refused principal {_who(client_config)} reading {topics} during the run "
                                f"(an ACL revoked?): {GRANT_HINT}; {then}")
    if kind == "GroupAuthorizationException":
        return KafkaAccessError(f"Kafka refused principal {_who(client_config)} its consumer group during the run "
                                f"(Read on groups starting 'tidemark-', prefixed): {GRANT_HINT}; {then}")
    if kind == "SaslAuthenticationException":
        return KafkaAccessError(f"Kafka refused the login of {_who(client_config)} during the run (a rotated "
                                "password?): fix kafka.security.sasl_password (or sasl_password_file / "
                                f"sasl_password_env); {then}")
    return KafkaAccessError(f"Kafka refused the TLS client {_who(client_config)} during the run (a certificate "
                            f"expired or revoked?): fix kafka.security.ssl_certificate_location; {then}")


def _who(conf: Mapping[str, Any]) -> str:
    if conf.get("sasl.username"):
        return repr(conf["sasl.username"])
    if conf.get("ssl.certificate.location"):
        return f"of the certificate {conf['ssl.certificate.location']}"
    return "(anonymous)"


def _cause(conf: Mapping[str, Any], errors: list[Any], named_by: str = "kafka.bootstrap_servers") -> Exception:
    """The first error that names a cause, as one line with the setting to fix."""
    from confluent_kafka import KafkaError

    bootstrap = conf.get("bootstrap.servers")
    protocol = conf.get("security.protocol", "PLAINTEXT")
    for err in errors:
        text = err.str()
        if err.code() == KafkaError._AUTHENTICATION:
            return KafkaAccessError(
                f"Kafka at {bootstrap} refused the login of {_who(conf)} ({conf.get('sasl.mechanism')}): wrong "
                "password, unknown user or a mechanism the broker does not enable. Fix kafka.security."
                "sasl_username and sasl_password (or sasl_password_file / sasl_password_env)")
        if err.code() == KafkaError._SSL or "SSL" in text and ("alert" in text or "handshake" in text):
            return KafkaAccessError(_tls_line(conf, text))
    if _refused(errors):
        return ServiceUnavailableError(
            f"Kafka at {bootstrap} ({named_by}) refused the connection: is the broker up, and is that the address?")
    return ServiceUnavailableError(
        f"no Kafka broker at {bootstrap} ({named_by}) answered a {protocol} client within {PREFLIGHT_SECONDS:g} s: "
        "is it up, is that the address, and does that listener speak kafka.security.protocol?")


def _tls_line(conf: Mapping[str, Any], text: str) -> str:
    bootstrap = conf.get("bootstrap.servers")
    lower = text.lower()
    if "expired" in lower and ("alert" in lower or "receive failed" in lower):
        return (f"Kafka at {bootstrap} refused the client certificate {conf.get('ssl.certificate.location')}: it has "
                "expired. Renew it and point kafka.security.ssl_certificate_location/ssl_key_location at the new one")
    if "alert" in lower or "receive failed" in lower:
        return (f"Kafka at {bootstrap} refused the TLS client (no certificate, or one it does not trust or that has "
                "expired). Set kafka.security.ssl_certificate_location and ssl_key_location to a certificate "
                "signed by a CA the broker trusts")
    if "expired" in lower:
        return (f"the TLS certificate of Kafka at {bootstrap} has expired; renew the broker's certificate "
                "(docs/security.md, \"Certificate and password rotation\")")
    if "hostname" in lower or "name mismatch" in lower or "subject" in lower:
        return (f"the TLS certificate of Kafka at {bootstrap} does not name that host; connect by a name it "
                "carries, or (knowing what it costs) set kafka.security.ssl_verify_hostname: false")
    if "verify failed" in lower or "unable to get" in lower or "self-signed" in lower:
        return (f"the TLS certificate of Kafka at {bootstrap} is not signed by a CA this client trusts; set "
                f"kafka.security.ssl_ca_location to the CA's PEM file (now: {conf.get('ssl.ca.location') or 'system CAs'})")
    return f"TLS to Kafka at {bootstrap} failed: {text.split(': ', 1)[-1]}. Check the kafka.security.ssl_* settings"


# -- PostgreSQL ---------------------------------------------------------------------------

#: libpq's words for a refusal no retry can mend, with what to tell the user.
_PG_REFUSALS = (
    (("password authentication failed", "no password supplied", "scram"),
     ("refused the login{user}: wrong or missing password. Fix postgres.dsn: its password, or the "
      "passfile=... it names (a libpq password file)")),
    (("certificate verify failed",),
     "has a TLS certificate this client does not trust: set sslrootcert=<the CA's PEM file> in postgres.dsn"),
    (("does not match host name",),
     "has a TLS certificate that does not name the host in postgres.dsn: connect by a name it carries"),
    (("certificate has expired", "certificate expired"),
     "has an expired TLS certificate: renew the server's certificate"),
    (("server does not support ssl",),
     "does not offer TLS, and postgres.dsn requires it (sslmode): enable TLS on the server"),
    (("tls connections only", "no pg_hba.conf entry", "no encryption"),
     ("refuses this kind of connection ({detail}): postgres.dsn needs sslmode=verify-full (or what the "
      "server's pg_hba.conf asks for)")),
    (("root certificate file",),
     "cannot be checked: the sslrootcert file in postgres.dsn does not exist"),
    (("ssl error", "certificate"),
     "failed the TLS handshake ({detail}): check sslrootcert, sslcert and sslkey in postgres.dsn"),
)


def postgres_refusal(exc: BaseException, dsn: str | None = None) -> PostgresAccessError | None:
    """The error to stop with if ``exc`` (a psycopg2 error) is a refusal, not an outage."""
    text = str(exc).strip()
    lower = text.lower()
    user = ""
    if dsn:
        from psycopg2.extensions import parse_dsn

        try:
            name = parse_dsn(dsn).get("user")
        except Exception:  # noqa: BLE001  (a DSN psycopg2 cannot parse: say nothing of the user)
            name = None
        user = f" of user {name!r}" if name else ""
    for words, message in _PG_REFUSALS:
        if any(w in lower for w in words):
            detail = text.split("FATAL:", 1)[-1].strip().splitlines()[0]
            return PostgresAccessError("PostgreSQL " + message.format(user=user, detail=detail))
    return None


def check_postgres(dsn: str, *, timeout: int = 8, named_by: str = "postgres.dsn") -> None:
    """Raise :class:`PostgresAccessError` if PostgreSQL refuses this DSN's login or TLS, and
    :class:`ServiceUnavailableError` if nothing answers at its address within ``timeout``.

    At a command's start an unreachable database is one line naming the address and the
    setting; once a relay runs, an outage is waited for by the relay's own retries instead.
    """
    import psycopg2
    from psycopg2.extensions import parse_dsn

    try:
        psycopg2.connect(dsn, connect_timeout=timeout).close()
    except psycopg2.Error as exc:
        refusal = postgres_refusal(exc, dsn)
        if refusal is not None:
            raise refusal from None
        try:
            parts = parse_dsn(dsn)
        except psycopg2.Error:
            parts = {}
        where = f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServiceUnavailableError(
            f"no PostgreSQL at {where} ({named_by}) answered within {timeout} s ({first}): is it up, and is "
            "that the address?") from None
