"""One pipeline's config and resolved endpoints, as every command and flow needs them.

The config file may leave ``kafka.bootstrap_servers`` unset, meaning "the embedded
stack's broker"; resolving that in one place keeps the CLI, the Prefect flows and
``tidemark status`` pointed at the same cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidemark.config import PipelineConfig, TidemarkConfig, load_config
from tidemark.settings import settings
from tidemark.storage import check_reachable


@dataclass(frozen=True)
class PipelineContext:
    config: TidemarkConfig
    pipeline: PipelineConfig
    bootstrap: str

    @property
    def client_config(self) -> dict[str, str]:
        """librdkafka properties (secrets in clear: only for the client)."""
        from connectors.kafka_config import librdkafka_config

        return librdkafka_config(self.config.kafka, self.bootstrap)

    @property
    def spark_options(self) -> dict[str, str]:
        from connectors.kafka_config import spark_options

        return spark_options(self.config.kafka, self.bootstrap)


def load(path: str | Path) -> TidemarkConfig:
    """``tidemark.yaml`` as the commands use it: against a secured embedded cluster, a config
    that names no credentials connects as the cluster's ``admin`` (its files under
    ``TIDEMARK_HOME``), so the two README commands work whatever the stack's security."""
    return with_stack_security(load_config(Path(path)))


def with_stack_security(config: TidemarkConfig) -> TidemarkConfig:
    if settings().kafka.security == "plaintext":
        return config
    from infra.stack import Stack

    stack = Stack(settings())
    registry = stack.registry()
    if config.schema_registry.url is None and registry is not None:  # the secured stack's registry, as admin
        from infra.registry import USER as REGISTRY_USER
        from tidemark.config import SchemaRegistryConfig

        config = config.model_copy(update={"schema_registry": SchemaRegistryConfig(
            url=registry.url, basic_auth_username=REGISTRY_USER, basic_auth_password_file=registry.password_file,
            ssl_ca_location=registry.ca.certificate)})
    if config.kafka.bootstrap_servers is not None or config.kafka.security.protocol != "PLAINTEXT":
        return config
    kafka = stack.kafka()
    if kafka is None:
        return config
    connection = config.kafka.model_copy(update={"security": kafka.client_security("admin")})
    return config.model_copy(update={"kafka": connection})


def preflight(config: TidemarkConfig, bootstrap: str, topics: tuple[str, ...] = ()) -> None:
    """One metadata request first: a broker that does not answer, a refused login, an
    untrusted certificate, a hidden topic or one the principal may not read becomes one
    clear line within seconds, not a Java stack trace or a 20-second transport failure
    from Spark later (``connectors.preflight``)."""
    from connectors.kafka_config import librdkafka_config
    from connectors.preflight import check_access, require_operation

    client = librdkafka_config(config.kafka, bootstrap)
    check_access(client, topics, named_by=kafka_named_by(config))
    if topics and config.kafka.security.protocol != "PLAINTEXT":
        require_operation(client, topics, "READ")


def kafka_named_by(config: TidemarkConfig) -> str:
    """The setting the Kafka address came from, as an error should name it."""
    if config.kafka.bootstrap_servers is not None:
        return "kafka.bootstrap_servers in the config"
    if settings().kafka.bootstrap_servers is not None:
        return "TIDEMARK_KAFKA__BOOTSTRAP_SERVERS"
    return "the embedded stack's broker: `tidemark stack up` starts it, TIDEMARK_KAFKA__BOOTSTRAP_SERVERS names another"


def postgres_named_by(config: TidemarkConfig) -> str:
    """The setting the PostgreSQL DSN came from, as an error should name it."""
    if config.postgres.dsn is not None:
        return "postgres.dsn in the config"
    if settings().postgres.dsn is not None:
        return "TIDEMARK_POSTGRES__DSN"
    return "the embedded stack's PostgreSQL: `tidemark stack up` starts it, TIDEMARK_POSTGRES__DSN names another"


def resolve_bootstrap(config: TidemarkConfig) -> str:
    if config.kafka.bootstrap_servers is not None:
        return config.kafka.bootstrap_servers
    from infra.stack import Stack

    return Stack(settings()).endpoints().kafka_bootstrap


def pipeline_context(config_path: str | Path, name: str, *, check: bool = True) -> PipelineContext:
    """The pipeline, its config and Kafka's address; with ``check``, the servers it needs answer.

    ``check=False`` is for a flow reading its schedule: the checks then run inside the flow's
    task, where an outage is retried by the schedule's policy instead of failing the run.
    """
    config = load(config_path).for_pipeline(name)
    pipeline = config.pipeline(name)
    if check:
        check_reachable((pipeline.target, pipeline.quarantine_path, pipeline.ledger_path))
    bootstrap = resolve_bootstrap(config)
    if check:
        preflight(config, bootstrap, pipeline.topics)
    return PipelineContext(config, pipeline, bootstrap)
