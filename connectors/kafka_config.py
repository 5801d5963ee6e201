"""One Kafka connection, two spellings: librdkafka properties and Spark ``kafka.*`` options.

librdkafka (confluent-kafka) and the Java client Spark uses name security settings
differently (``sasl.username`` vs a JAAS line, ``ssl.ca.location`` vs a PEM truststore);
this module is the only place that knows both, so the relay, the admin calls and the
Spark reads always talk to the cluster the same way.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tidemark.config import KafkaConnection

_JAAS_MODULE = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


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
        props["sasl.password"] = sec.sasl_password.get_secret_value() if sec.sasl_password else ""
    if sec.ssl_ca_location:
        props["ssl.ca.location"] = str(sec.ssl_ca_location)
    return props


def spark_options(conn: KafkaConnection, bootstrap: str) -> dict[str, str]:
    """``kafka.*`` options for Spark's Kafka source, always read_committed."""
    sec = conn.security
    opts = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.security.protocol": sec.protocol,
        "kafka.isolation.level": "read_committed",
    }
    if sec.sasl_mechanism:
        password = sec.sasl_password.get_secret_value() if sec.sasl_password else ""
        user = (sec.sasl_username or "").replace('"', '\\"')
        password = password.replace('"', '\\"')
        opts["kafka.sasl.mechanism"] = sec.sasl_mechanism
        opts["kafka.sasl.jaas.config"] = (
            f'{_JAAS_MODULE[sec.sasl_mechanism]} required username="{user}" password="{password}";'
        )
    if sec.ssl_ca_location:
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = str(sec.ssl_ca_location)
    return opts
