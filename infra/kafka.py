"""An embedded Apache Kafka (KRaft) cluster of one or three combined broker+controller nodes.

Node *i* (from 0) listens for clients on ``port + 2i`` and for its controller on
``port + 2i + 1``, always on 127.0.0.1. One node runs with replication factor 1 for
everything, including the transaction state log; three nodes run with RF 3 and
``min.insync.replicas=2``, the smallest layout in which a broker can die without
stopping transactional writes. Storage is formatted once per data directory, by the
broker's own ``StorageTool``; the cluster formats with ``transaction.version=2``
(KIP-890), the default from Kafka 4.0.

State lives under ``<root>/node-<i>/``: ``server.properties``, ``data/``, ``broker.log``
and ``broker.pid``.

Secured (``security="sasl_ssl"`` or ``"mtls"``), the client listener speaks TLS with a
certificate from a throwaway local CA (``infra.tls``, under ``<root>/secrets``) and
authenticates every client, by SCRAM-SHA-512/256 (users made at format time with
``--add-scram``) or by client certificate (CN = principal). The ``StandardAuthorizer``
denies whatever no ACL allows; ``admin`` and the brokers themselves are super users, and
the controller listener stays PLAINTEXT on loopback (its anonymous principal is a super
user: only brokers on this host reach it).
"""

from __future__ import annotations

import base64
import secrets
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from infra.jars import JarSet
from infra.process import (
    LOOPBACK,
    PidFile,
    java_executable,
    require_free_ports,
    spawn,
    stop_process,
    tail,
    wait_until,
)
from infra.tls import LocalCA, write_private
from tidemark.config import KafkaSecurity
from tidemark.errors import ServiceStartError

#: Principals of a secured embedded cluster: a super user, and the two whose least
#: privileges ``connectors.acls`` grants.
PRINCIPALS = ("admin", "relay", "ingest")

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = warn
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = warn
logger.storage.name = org.apache.kafka.storage
logger.storage.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
"""

@dataclass(frozen=True)
class KafkaNode:
    node_id: int
    client_port: int
    controller_port: int
    directory: Path

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def log(self) -> Path:
        return self.directory / "broker.log"

    @property
    def pidfile(self) -> PidFile:
        return PidFile(self.directory / "broker.pid")

def _accepts(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=1).close()
    except OSError:
        return False
    return True


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64, never starting with '-'.

    An id like ``-abc...`` is read by the storage tool as an option (the run fails with
    "expected one argument"); Kafka's own ``Uuid.randomUuid`` redraws such ids too.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class EmbeddedKafka:
    """Start, probe and stop the local KRaft cluster whose state lives in ``root``."""

    def __init__(self, root: Path, jars: JarSet, *, port: int = 19092, brokers: int = 1, heap: str = "512m",
                 security: str = "plaintext") -> None:
        if brokers not in (1, 3):
            raise ValueError("the embedded cluster runs 1 or 3 brokers")
        if security not in ("plaintext", "sasl_ssl", "mtls"):
            raise ValueError("the embedded cluster's security is plaintext, sasl_ssl or mtls")
        self.root = root
        self.security = security
        self.ca = LocalCA(root / "secrets")
        self.jars = jars
        self.heap = heap
        self.nodes = [
            KafkaNode(i + 1, port + 2 * i, port + 2 * i + 1, root / f"node-{i + 1}") for i in range(brokers)
        ]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def version(self) -> str:
        return self.jars.version_of("kafka_2.13")

    # -- security -------------------------------------------------------------------

    @property
    def _listener(self) -> str:
        return {"plaintext": "PLAINTEXT", "sasl_ssl": "SASL_SSL", "mtls": "SSL"}[self.security]

    def password_file(self, principal: str) -> Path:
        """Where the SCRAM password of ``principal`` is kept (made on first use, mode 0600)."""
        path = self.ca.directory / f"{principal}.password"
        if not path.exists():
            write_private(path, secrets.token_urlsafe(24).encode())
        return path

    def client_security(self, principal: str = "admin") -> KafkaSecurity:
        """How a client authenticates as ``principal`` to this cluster (files, never secrets in clear)."""
        if self.security == "plaintext":
            return KafkaSecurity()
        ca = self.ca.certificate
        if not ca.exists():
            self.ca.issue("broker", server=True)
        if self.security == "sasl_ssl":
            return KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username=principal,
                                 sasl_password_file=self.password_file(principal), ssl_ca_location=ca)
        pem = self.ca.issue(principal)
        return KafkaSecurity(protocol="SSL", ssl_ca_location=ca, ssl_certificate_location=pem.certificate,
                             ssl_key_location=pem.key)

    def _security_lines(self) -> list[str]:
        if self.security == "plaintext":
            return []
        broker = self.ca.issue("broker", server=True)
        lines = [
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            "super.users=User:admin;User:broker;User:ANONYMOUS",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={broker.combined}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.ca.certificate}",
            "ssl.endpoint.identification.algorithm=https",
        ]
        if self.security == "sasl_ssl":
            password = self.password_file("admin").read_text().strip()
            lines += [
                "sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256",
                "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
                *(f"listener.name.sasl_ssl.{m}.sasl.jaas.config=org.apache.kafka.common.security.scram."
                  f'ScramLoginModule required username="admin" password="{password}";'
                  for m in ("scram-sha-512", "scram-sha-256")),
            ]
        else:
            lines += ["ssl.client.auth=required", "ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/$1/,DEFAULT"]
        return lines

    def _scram_users(self) -> list[str]:
        if self.security != "sasl_ssl":
            return []
        out = []
        for principal in PRINCIPALS:
            password = self.password_file(principal).read_text().strip()
            for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
                out += ["--add-scram", f"{mechanism}=[name={principal},password={password}]"]
        return out

    # -- configuration ------------------------------------------------------------

    def _properties(self, node: KafkaNode) -> str:
        rf = len(self.nodes)
        min_isr = 2 if rf == 3 else 1
        if rf == 1:
            quorum = f"controller.quorum.bootstrap.servers={LOOPBACK}:{node.controller_port}"
        else:
            voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.controller_port}" for n in self.nodes)
            quorum = f"controller.quorum.voters={voters}"
        return "\n".join([
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            quorum,
            f"listeners={self._listener}://{LOOPBACK}:{node.client_port},CONTROLLER://{LOOPBACK}:{node.controller_port}",
            f"advertised.listeners={self._listener}://{LOOPBACK}:{node.client_port}",
            "controller.listener.names=CONTROLLER",
            f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{self._listener}:{self._listener}",
            f"inter.broker.listener.name={self._listener}",
            *self._security_lines(),
            f"log.dirs={node.directory / 'data'}",
            "num.partitions=1",
            f"default.replication.factor={rf}",
            f"min.insync.replicas={min_isr}",
            f"offsets.topic.replication.factor={rf}",
            "offsets.topic.num.partitions=8",
            f"transaction.state.log.replication.factor={rf}",
            f"transaction.state.log.min.isr={min_isr}",
            "transaction.state.log.num.partitions=8",
            "group.initial.rebalance.delay.ms=0",
            # Topics are created on purpose (connectors.admin); a typo must not make one.
            "auto.create.topics.enable=false",
            "",
        ])

    def _java(self, main: str, *args: str, heap: str | None = None) -> list[str]:
        opts = [f"-Xms{heap}", f"-Xmx{heap}"] if heap else ["-Xmx256m"]
        return [
            java_executable(), *opts, "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
            "-cp", self.jars.classpath, main, *args,
        ]

    def _format(self) -> None:
        cluster_file = self.root / "cluster.id"
        if not cluster_file.exists():
            cluster_file.write_text(new_cluster_id())
        cluster_id = cluster_file.read_text().strip()
        for node in self.nodes:
            if (node.directory / "data" / "meta.properties").exists():
                continue
            extra = ["--standalone"] if len(self.nodes) == 1 else []
            cmd = self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                             "-c", str(node.directory / "server.properties"), *extra, *self._scram_users())

            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise ServiceStartError(
                    f"formatting Kafka storage for node {node.node_id} failed:\n{proc.stdout}{proc.stderr}"
                )

    # -- lifecycle ----------------------------------------------------------------

    def running_nodes(self) -> list[KafkaNode]:
        return [n for n in self.nodes if n.pidfile.process() is not None]

    def start(self, *, timeout: float = 90.0) -> None:
        """Start every node that is not running and wait until the cluster serves."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "log4j2.properties").write_text(_LOG4J2)
        to_start = [n for n in self.nodes if n.pidfile.process() is None]
        if not to_start:
            return
        require_free_ports(
            {f"kafka node {n.node_id} {kind}": p for n in to_start
             for kind, p in (("client", n.client_port), ("controller", n.controller_port))},
            "TIDEMARK_KAFKA__PORT",
        )
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            props = node.directory / "server.properties"
            props.touch(mode=0o600)  # the inter-broker SCRAM password is in it
            props.write_text(self._properties(node))
        self._format()
        for node in to_start:
            self._spawn(node)
        for node in self.nodes:
            self._await(node, timeout)

    def _spawn(self, node: KafkaNode) -> None:
        command = self._java("kafka.Kafka", str(node.directory / "server.properties"), heap=self.heap)
        node.pidfile.write(spawn(command, log=node.log, cwd=node.directory))

    def _await(self, node: KafkaNode, timeout: float) -> None:
        def alive() -> bool:
            return node.pidfile.process() is not None

        wait_until(lambda: self._serves(expect=len(self.nodes)), timeout=timeout,
                   what=f"Kafka node {node.node_id}", alive=alive, log=node.log)

    def _serves(self, *, expect: int) -> bool:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        if not all(_accepts(n.client_port) for n in self.nodes):
            return False
        from connectors.kafka_config import librdkafka_config
        from tidemark.config import KafkaConnection

        conf = librdkafka_config(KafkaConnection(security=self.client_security()), self.bootstrap_servers)
        conf.pop("logger", None)
        admin = AdminClient({**conf, "socket.timeout.ms": 2000, "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=2)
        except KafkaException:
            return False
        return len(metadata.brokers) >= expect

    def stop(self, *, grace: float = 30.0) -> None:
        """Controlled shutdown of every node (SIGTERM), SIGKILL after ``grace`` seconds."""
        for node in reversed(self.nodes):
            proc = node.pidfile.process()
            if proc is not None:
                stop_process(proc, grace=grace)
            node.pidfile.path.unlink(missing_ok=True)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node: for fault-injection tests."""
        node = self.nodes[node_id - 1]
        proc = node.pidfile.process()
        if proc is not None:
            proc.kill()
            proc.wait(10)

    def start_node(self, node_id: int, *, timeout: float = 90.0) -> None:
        """Restart one node after :meth:`kill_node`."""
        node = self.nodes[node_id - 1]
        if node.pidfile.process() is None:
            self._spawn(node)
        self._await(node, timeout)

    def describe(self) -> list[str]:
        lines = []
        for node in self.nodes:
            proc = node.pidfile.process()
            state = f"running (pid {proc.pid})" if proc else "stopped"
            lines.append(f"node {node.node_id} {node.address} {state}; log {node.log}")
        return lines

    def last_log_lines(self) -> str:
        return "\n".join(f"--- node {n.node_id}\n{tail(n.log)}" for n in self.nodes)
