"""What a relay run did: the counts :meth:`outbox.relay.Relay.run` returns.

Why this is its own module: the protocol (``outbox.relay``) and its outage handling
(``outbox.outage``) both count into the report, and the outage handling sits below the
protocol, so the report sits below both. Import it from ``outbox.relay``, the protocol's home.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RelayReport:
    transactions: int = 0
    events: int = 0
    kafka_transactions: int = 0
    """Groups committed (each one Kafka transaction)."""
    skipped: int = 0
    """Transactions redelivered by the slot that were already in Kafka."""
    deleted: int = 0
    dead_lettered: int = 0
    """Source transactions moved to the dead letters instead of Kafka."""
    redone: int = 0
    """Groups relayed again after an abort or a commit of unknown outcome (each after a fence)."""
    refenced: int = 0
    """Times the producer was replaced after a disturbed connection (steps 1-2 again)."""
    outages: int = 0
    """Times Kafka was unavailable and the relay stepped back."""
    registry_outages: int = 0
    """Times the schema registry did not answer a lookup a payload needed and the relay waited for it."""
    registry_down: bool = False
    """The relay is waiting for the schema registry to answer now."""
    topics: Counter[str] = field(default_factory=Counter)

