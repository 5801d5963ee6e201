"""``tidemark serve``: the pipelines' Prefect deployments, served from this process.

Per pipeline: ``ingest-<name>`` on its ``schedule.ingest_every_seconds`` interval,
``audit-<name>`` on ``schedule.audit_every_seconds``, ``maintain-<name>`` on
``schedule.maintain_every_seconds`` (its own slot: it runs beside ingest), and ``backfill-<name>`` with no
schedule (run it with parameters from the UI or ``prefect deployment run``). Each has
deployment concurrency 1 with collisions cancelled: a tick that finds the previous run
still going is dropped, not queued, so a slow run never builds a backlog. With
``--relay``, a ``relay`` deployment supervises the outbox relay and one run of it is
started as soon as the deployments exist.

Every run's Spark work goes to serve's warm driver (:mod:`orchestration.driver`): one
Spark session, started with serve, instead of a JVM per run; ``warm_driver=False``
(``tidemark serve --no-warm-driver``) gives each run a driver of its own.

Schedules need a Prefect server: Prefect's ephemeral API runs no scheduler service.
Without ``PREFECT_API_URL`` the embedded stack's Prefect server is used (``tidemark
stack up --prefect`` starts it; ``serve`` starts it if needed).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

from orchestration.flows import audit_flow, backfill_flow, ingest_flow, maintain_flow, relay_flow
from orchestration.slots import ensure_limit, limit_name
from tidemark.config import TidemarkConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from offsets.frames import BatchResult

log = logging.getLogger(__name__)

ONE_AT_A_TIME = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


def deployments(config: TidemarkConfig, config_path: Path, *, relay: bool = False) -> list[Any]:
    path = str(config_path.resolve())
    out: list[Any] = []
    for p in config.pipelines:
        sched = p.schedule
        out.append(ingest_flow.to_deployment(
            name=f"ingest-{p.name}", parameters={"pipeline": p.name, "config": path},
            interval=sched.ingest_every_seconds, concurrency_limit=ONE_AT_A_TIME, tags=["tidemark", p.name],
            description=f"bounded ingest of {p.name} into {p.target}"))
        out.append(audit_flow.to_deployment(
            name=f"audit-{p.name}", parameters={"pipeline": p.name, "config": path},
            interval=sched.audit_every_seconds, concurrency_limit=ONE_AT_A_TIME, tags=["tidemark", p.name],
            description=f"quality checks of {p.target}"))
        out.append(maintain_flow.to_deployment(
            name=f"maintain-{p.name}", parameters={"pipeline": p.name, "config": path},
            interval=sched.maintain_every_seconds, concurrency_limit=ONE_AT_A_TIME, tags=["tidemark", p.name],
            description=f"compact and vacuum {p.name}'s tables (retention {p.maintenance.retain_hours:g} h)"))
        out.append(backfill_flow.to_deployment(
            name=f"backfill-{p.name}", parameters={"pipeline": p.name, "config": path},
            concurrency_limit=ONE_AT_A_TIME, tags=["tidemark", p.name],
            description=f"re-read {p.name}'s topics into another table (give `into` and one of batches, "
                        "from_offsets, from_timestamp)"))
    if relay:
        out.append(relay_flow.to_deployment(name="relay", parameters={"config": path},
                                            concurrency_limit=ONE_AT_A_TIME, tags=["tidemark", "relay"],
                                            description="the outbox relay, restarted with backoff on crash"))
    return out


def _start_relay_when_deployed(deadline_seconds: float = 300) -> None:
    """Start one run of the relay deployment once ``serve`` has registered it."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            run_deployment("tidemark-relay/relay", timeout=0)
            log.info("relay supervisor started")
            return
        except ObjectNotFound:
            time.sleep(1)
    log.error("the relay deployment never appeared; start it with `prefect deployment run tidemark-relay/relay`")


def _driver_session() -> Any:
    from infra.spark import build_session
    from orchestration.driver import FAIR
    from tidemark.settings import settings

    return build_session(settings(), "tidemark-serve", extra=FAIR)


def serve_all(config: TidemarkConfig, config_path: Path, *, relay: bool = False, warm_driver: bool = True,
              on_batch: Callable[[str, BatchResult, float], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT; Prefect pauses the schedules on the way out.

    ``on_batch(pipeline, result, seconds)`` is told every batch the warm driver commits (metrics).
    """
    from prefect import serve

    from orchestration.driver import DriverService

    for p in config.pipelines:
        ensure_limit(limit_name(p.name))
    if relay:
        threading.Thread(target=_start_relay_when_deployed, daemon=True, name="start-relay").start()
    if not (warm_driver and config.pipelines):
        serve(*deployments(config, config_path, relay=relay))
        return
    with DriverService(_driver_session, on_batch=on_batch):  # before serve: its flow-run processes inherit the environment
        serve(*deployments(config, config_path, relay=relay))
