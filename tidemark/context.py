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


def resolve_bootstrap(config: TidemarkConfig) -> str:
    if config.kafka.bootstrap_servers is not None:
        return config.kafka.bootstrap_servers
    from infra.stack import Stack

    return Stack(settings()).endpoints().kafka_bootstrap


def pipeline_context(config_path: str | Path, name: str) -> PipelineContext:
    config = load_config(Path(config_path))
    return PipelineContext(config, config.pipeline(name), resolve_bootstrap(config))
