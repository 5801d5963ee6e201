"""One run per pipeline at a time: a Prefect global concurrency limit of 1 per pipeline.

Deployment concurrency (``serve``) only covers runs of one deployment; a manual run, a
second ``serve`` or a flow called from code would slip past it. The in-code limit is
strict: it is created if missing and acquisition fails loudly rather than running
unguarded. A run that cannot get the slot within ``wait_seconds`` is refused with a
transient error. (Correctness never rests on this: the ledger claim refuses a rival
batch. The slot keeps rivals from even starting, so runs queue instead of failing.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prefect import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectNotFound

from tidemark.errors import TransientError

LIMIT_PREFIX = "tidemark-pipeline-"

LEASE_SECONDS = 60.0
"""A held slot's lease (the server's minimum), renewed every 45 s while its run lives: a killed
run frees it within this plus the server's reaping interval (15 s), not Prefect's default 300 s."""


class PipelineBusyError(TransientError):
    """Another run of the pipeline held its slot for longer than this run would wait."""


def limit_name(pipeline: str) -> str:
    return LIMIT_PREFIX + pipeline


def ensure_limit(name: str) -> None:
    """Create the global concurrency limit ``name`` with one slot, unless it exists."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except Exception:  # noqa: BLE001 - a rival created it first; check it exists
                client.read_global_concurrency_limit_by_name(name)


@dataclass
class Slot:
    name: str
    acquired_at: float = 0.0
    released_at: float = 0.0
    waited_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float | str]:
        return {"name": self.name, "acquired_at": self.acquired_at, "released_at": self.released_at,
                "waited_seconds": round(self.waited_seconds, 3)}


@contextmanager
def pipeline_slot(pipeline: str, *, wait_seconds: float) -> Iterator[Slot]:
    """Hold the pipeline's slot for the block; wall-clock times are recorded on the Slot."""
    slot = Slot(limit_name(pipeline))
    ensure_limit(slot.name)
    asked = time.time()
    try:
        with concurrency(slot.name, occupy=1, strict=True, timeout_seconds=wait_seconds,
                         lease_duration=LEASE_SECONDS):
            slot.acquired_at = time.time()
            slot.waited_seconds = slot.acquired_at - asked
            try:
                yield slot
            finally:
                slot.released_at = time.time()
    except TimeoutError:
        if slot.acquired_at:
            raise
        raise PipelineBusyError(f"another run of pipeline {pipeline!r} held its slot for {wait_seconds:.0f}s; "
                            "this run was refused (raise schedule.wait_for_slot_seconds to wait longer)") from None
