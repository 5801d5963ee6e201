"""The least privileges each Tidemark component needs on a cluster with an authorizer.

Derived from ``tidemark.yaml`` so they follow the config: the relay's event topics (a
prefix for a ``{aggregatetype}`` template), its offsets and manifest topics and its
``transactional.id``; each pipeline's topics and the manifest it reads. ``tidemark acls``
prints them as ``kafka-acls`` commands, or creates them with ``--apply`` (as a principal
allowed to alter ACLs). Every reader, Tidemark's and Spark's, assigns its partitions and
commits nothing, under a group id starting ``tidemark-``. With the pinned librdkafka and
Kafka client they ran without any group ACL (tests/integration/test_secured.py, relay and
ingest), but librdkafka versions have looked up the coordinator of an assign-only
consumer's group, which needs Read (Describe) on it: one prefixed group grant per
component keeps an upgrade from turning into an outage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidemark.config import KafkaSecurity, PipelineConfig, TidemarkConfig
from tidemark.errors import ConfigError, KafkaAccessError

_PRODUCE = ("WRITE", "DESCRIBE", "CREATE", "DESCRIBE_CONFIGS")

#: What every group id of Tidemark's readers starts with (librdkafka's and Spark's alike).
READER_GROUPS = "tidemark-"


@dataclass(frozen=True)
class Grant:
    principal: str
    """``User:<name>``."""
    resource: str
    """TOPIC, GROUP or TRANSACTIONAL_ID."""
    name: str
    pattern: str
    """LITERAL or PREFIXED."""
    operations: tuple[str, ...]

    def command(self, bootstrap: str = "BROKER:9093") -> str:
        flag = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id"}[self.resource]
        ops = " ".join("--operation " + "".join(w.capitalize() for w in o.split("_")) for o in self.operations)
        return (f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
                f"--allow-principal {self.principal} {ops} {flag} '{self.name}' "
                f"--resource-pattern-type {self.pattern.lower()}")


def relay_grants(config: TidemarkConfig, principal: str) -> list[Grant]:
    relay = config.relay
    grants = [Grant(principal, "TOPIC", relay.offsets_topic, "LITERAL", ("READ", *_PRODUCE)),
              Grant(principal, "TOPIC", relay.manifest_topic, "LITERAL", _PRODUCE),
              Grant(principal, "TRANSACTIONAL_ID", relay.transactional_id, "LITERAL", ("WRITE", "DESCRIBE")),
              Grant(principal, "GROUP", READER_GROUPS, "PREFIXED", ("READ",))]
    head, placeholder, _ = relay.topic.partition("{aggregatetype}")
    if placeholder and not head:
        raise ConfigError("relay.topic starts with {aggregatetype}: no ACL prefix can cover it; give the topics "
                          "a fixed prefix (e.g. outbox.event.{aggregatetype}) or grant the relay by hand")
    grants.append(Grant(principal, "TOPIC", head, "PREFIXED" if placeholder else "LITERAL", _PRODUCE))
    grants += [Grant(principal, "TOPIC", t, "LITERAL", _PRODUCE) for t in sorted(set(relay.routes.values()))]
    return grants


def _pattern_prefix(pipeline: PipelineConfig) -> str:
    """The literal text every topic ``topic_pattern`` matches starts with."""
    pattern = pipeline.topic_pattern or ""
    match = re.match(r"\^?((?:[A-Za-z0-9_\-]|\\\.)*)", pattern)
    prefix = (match.group(1) if match else "").replace("\\.", ".")
    if not prefix:
        raise ConfigError(f"pipeline {pipeline.name!r}: topic_pattern {pattern!r} has no literal prefix an ACL "
                          "could cover; list its topics instead, or grant the ingest principal by hand")
    return prefix


def principal_of(security: KafkaSecurity | None, default: str) -> str:
    """The user a component's own credentials name: its SASL user, or its certificate's CN
    (what the broker's principal mapping takes); ``default`` when it has none of its own."""
    if security is None:
        return default
    if security.sasl_username:
        return security.sasl_username
    if security.ssl_certificate_location is not None:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        cert = x509.load_pem_x509_certificate(security.ssl_certificate_location.expanduser().read_bytes())
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if names:
            return str(names[0].value)
    return default


def ingest_grants(config: TidemarkConfig, principal: str, only: str | None = None) -> list[Grant]:
    """What ``principal`` needs to run the config's pipelines (``only``: that one)."""
    grants: list[Grant] = []
    for p in config.pipelines:
        if only is not None and p.name != only:
            continue
        if p.topics:
            grants += [Grant(principal, "TOPIC", t, "LITERAL", ("READ", "DESCRIBE")) for t in p.topics]
        else:
            grants.append(Grant(principal, "TOPIC", _pattern_prefix(p), "PREFIXED", ("READ", "DESCRIBE")))
        if p.transactions.manifest_topic:
            grants.append(Grant(principal, "TOPIC", p.transactions.manifest_topic, "LITERAL", ("READ", "DESCRIBE")))
    grants.append(Grant(principal, "GROUP", READER_GROUPS, "PREFIXED", ("READ",)))
    return merged(grants)


def merged(grants: list[Grant]) -> list[Grant]:
    """One grant per principal and resource pattern, with the operations of all that name it."""
    unique: dict[tuple[str, str, str, str], Grant] = {}
    for g in grants:
        key = (g.principal, g.resource, g.name, g.pattern)
        if key in unique:
            g = Grant(*key, tuple(dict.fromkeys(unique[key].operations + g.operations)))
        unique[key] = g
    return list(unique.values())


def apply(client_config: Mapping[str, Any], grants: list[Grant], timeout: float = 15.0) -> None:
    """Create ``grants`` (idempotent: Kafka keeps one copy of an ACL however often it is added)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [AclBinding(ResourceType[g.resource], g.name, ResourcePatternType[g.pattern], g.principal, "*",
                           AclOperation[op], AclPermissionType.ALLOW)
                for g in grants for op in g.operations]
    if not bindings:
        return
    admin = AdminClient({k: v for k, v in client_config.items() if k != "logger"})
    for binding, future in admin.create_acls(bindings, request_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as exc:
            raise KafkaAccessError(f"could not create the ACL {binding}: {exc.args[0].str()}; run `tidemark acls "
                                   "--apply` as a principal allowed to alter ACLs (a super user)") from None
