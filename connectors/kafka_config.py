"""One Kafka connection, two spellings: librdkafka properties and Spark ``kafka.*`` options.

librdkafka (confluent-kafka) and the Java client Spark uses name security settings
differently (``sasl.username`` vs a JAAS line, ``ssl.ca.location`` vs a PEM truststore);
this module is the only place that knows both, so the relay, the admin calls and the
Spark reads always talk to the cluster the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from pathlib import Path
from typing import Any

from tidemark.config import KafkaConnection
from tidemark.errors import ConfigError

_JAAS_MODULE = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


#: Keys :func:`fingerprint`: the same within this process, never the same in another.
_FINGERPRINT_KEY = os.urandom(16)


def fingerprint(options: dict[str, Any]) -> str:
    """What identifies a Kafka client's settings within this process, and says nothing of them.

    Kept clients (Spark's pooled consumers, the manifest's consumers) are found again by it,
    so it is an HMAC of every option, credentials included, and of the files they name
    (CA, keystore): a changed password, or a certificate replaced even in place, gets new
    clients. Objects among the options (a logger) count by identity.
    """
    text = json.dumps(sorted(options.items()), default=lambda o: f"{type(o).__name__}@{id(o)}")
    mac = hmac.new(_FINGERPRINT_KEY, text.encode(), hashlib.sha256)
    for key, value in sorted(options.items()):  # a CA or keystore replaced in place counts as a change
        if key.endswith(".location") and isinstance(value, str) and os.path.isfile(value):
            with open(value, "rb") as f:
                mac.update(f.read())
    return mac.hexdigest()[:20]


def client_logging() -> dict[str, Any]:
    """Under the CLI (``tidemark.logs``), librdkafka's lines go through Python logging to the log file
    instead of straight to stderr; elsewhere, librdkafka's default."""
    return {"logger": logging.getLogger("librdkafka")} if os.environ.get("TIDEMARK_LOG_DIR") else {}


def librdkafka_config(conn: KafkaConnection, bootstrap: str) -> dict[str, Any]:
    """Properties for confluent-kafka clients (secrets in clear: pass straight to the client)."""
    sec = conn.security
    props: dict[str, Any] = {"bootstrap.servers": bootstrap, "security.protocol": sec.protocol,
                             **client_logging()}
    if sec.sasl_mechanism:
        props["sasl.mechanism"] = sec.sasl_mechanism
        props["sasl.username"] = sec.sasl_username or ""
        props["sasl.password"] = sec.secret("sasl_password")
    if sec.protocol.endswith("SSL"):
        props["ssl.endpoint.identification.algorithm"] = "https" if sec.ssl_verify_hostname else "none"
        if sec.ssl_ca_location:
            props["ssl.ca.location"] = str(_readable(sec.ssl_ca_location, "ssl_ca_location"))
        if sec.ssl_certificate_location and sec.ssl_key_location:
            props["ssl.certificate.location"] = str(_readable(sec.ssl_certificate_location, "ssl_certificate_location"))
            props["ssl.key.location"] = str(_readable(sec.ssl_key_location, "ssl_key_location"))
            key_password = sec.secret("ssl_key_password", required=False)
            if key_password is not None:
                props["ssl.key.password"] = key_password
    return props


def spark_options(conn: KafkaConnection, bootstrap: str) -> dict[str, str]:
    """``kafka.*`` options for Spark's Kafka source, always read_committed.

    The SASL password travels in ``kafka.sasl.jaas.config``, the one way the Java client
    takes it. Spark's plans of a Kafka read show none of its options, and the Java client
    logs the JAAS line as ``[hidden]``; the no-leak tests (``test_secured*.py``) hold both to it.
    """
    sec = conn.security
    opts = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.security.protocol": sec.protocol,
        "kafka.isolation.level": "read_committed",
    }
    if sec.sasl_mechanism:
        password = (sec.secret("sasl_password") or "").replace("\\", "\\\\").replace('"', '\\"')
        user = (sec.sasl_username or "").replace("\\", "\\\\").replace('"', '\\"')
        opts["kafka.sasl.mechanism"] = sec.sasl_mechanism
        opts["kafka.sasl.jaas.config"] = (
            f'{_JAAS_MODULE[sec.sasl_mechanism]} required username="{user}" password="{password}";'
        )
    if sec.protocol.endswith("SSL"):
        opts["kafka.ssl.endpoint.identification.algorithm"] = "https" if sec.ssl_verify_hostname else ""
        if sec.ssl_ca_location:
            opts["kafka.ssl.truststore.type"] = "PEM"
            opts["kafka.ssl.truststore.location"] = str(_readable(sec.ssl_ca_location, "ssl_ca_location"))
        if sec.ssl_certificate_location and sec.ssl_key_location:
            key_password = sec.secret("ssl_key_password", required=False)
            keystore, kind = java_keystore(_readable(sec.ssl_certificate_location, "ssl_certificate_location"),
                                           _readable(sec.ssl_key_location, "ssl_key_location"), key_password)
            opts["kafka.ssl.keystore.type"] = kind
            opts["kafka.ssl.keystore.location"] = str(keystore)
            if key_password is not None:
                opts["kafka.ssl.keystore.password"] = key_password
                opts["kafka.ssl.key.password"] = key_password
    return opts


def _readable(path: Path, setting: str) -> Path:
    """``path`` expanded, or a ConfigError naming the setting: a missing file must not
    surface as a TLS handshake failure minutes later."""
    full = path.expanduser()
    if not full.is_file():
        raise ConfigError(f"kafka.security.{setting}: no file at {full}; fix the path in tidemark.yaml")
    return full


def java_keystore(certificate: Path, key: Path, password: str | None) -> tuple[Path, str]:
    """The client's private key and certificate chain in a keystore the Java client can open,
    and its type.

    A key without a password goes into one PEM file of key (PKCS#8, the only form the PEM
    keystore takes) plus chain. An encrypted key cannot: Java 17 reads an encrypted PKCS#8
    key only under the old PBES1 schemes, and today's keys (``openssl``, ``cryptography``)
    use PBES2. So it goes into a PKCS#12 keystore encrypted with the same password (AES-256,
    which Java's PKCS#12 reads): the key never lies on disk in clear. Written once per
    certificate/key content under ``$TIDEMARK_HOME/run`` (mode 0600), so a rotated
    certificate gets a new file and the old one is never read again.
    """
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    from tidemark.settings import settings

    cert_pem, key_pem = certificate.read_bytes(), key.read_bytes()
    secret = password.encode() if password is not None else None
    digest = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()[:16]
    kind = "PKCS12" if secret else "PEM"
    out = settings().home_dir / "run" / f"kafka-keystore-{digest}.{'p12' if secret else 'pem'}"
    if out.exists():
        return out, kind
    try:
        private = serialization.load_pem_private_key(key_pem, password=secret)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"kafka.security.ssl_key_location: {key} is not a PEM private key this "
                          f"password opens ({exc}); check the file and ssl_key_password") from None
    if secret:
        try:
            chain = x509.load_pem_x509_certificates(cert_pem)
        except ValueError as exc:
            raise ConfigError(f"kafka.security.ssl_certificate_location: {certificate} holds no PEM certificate "
                              f"({exc}); fix the path in tidemark.yaml") from None
        body = pkcs12.serialize_key_and_certificates(
            b"tidemark", private, chain[0], chain[1:] or None,  # type: ignore[arg-type]
            serialization.BestAvailableEncryption(secret))
    else:
        body = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()) + cert_pem
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = out.with_suffix(f".{os.getpid()}-{os.urandom(4).hex()}.tmp")  # two processes may write it at once
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(body)
    os.replace(tmp, out)
    return out, kind
