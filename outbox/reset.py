"""``tidemark outbox init --reset-relay``: start the relay's stream over on the database as it is now.

The recovery after the relay stopped with ``SourceChangedError`` (a re-initialised,
replaced or restored database, a failover before the position, a dropped, recreated or
invalidated slot) or after ``outbox init`` declined to recreate a missing slot. Steps:

1. **Fence** the relay in Kafka (``init_transactions`` with its ``transactional.id``):
   a relay still running can commit nothing more.
2. **Recreate the slot**, exporting the snapshot it starts from: every transaction that
   commits after its consistent point ``C`` will be in its stream, none before.
3. **Requeue** the outbox rows that snapshot sees, i.e. rows committed before ``C``
   and not yet deleted by a relay: they are in no stream. Each source transaction's
   rows (grouped by the transaction that inserted them, oldest first) are deleted and
   inserted again in one new transaction, so they stream again whole, after ``C``.
4. **Write the position** ``C`` with this database's identity, so the relay resumes here.

Rows inserted after ``C`` are streamed once, not requeued. The one duplicate this can
make: a row the old relay had relayed but not yet deleted (its acknowledgement was
pending) is relayed again, with the same event id (``id`` header); ingest with ``dedup``
drops the copy. Nothing committed is lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from connectors.producer import TransactionalProducer
from outbox.pgoutput import format_lsn, parse_lsn
from outbox.position import OFFSETS_TOPIC_CONFIG, Position, offsets_partition
from outbox.schema import TableName
from outbox.source import identify
from tidemark.config import RelayConfig
from tidemark.errors import TerminalError


@dataclass(frozen=True)
class ResetReport:
    slot: str
    start_lsn: str
    requeued_rows: int
    requeued_transactions: int


def reset_relay(relay: RelayConfig, *, dsn: str, client_config: dict[str, Any]) -> ResetReport:
    import psycopg2
    from confluent_kafka.admin import AdminClient, NewTopic
    from psycopg2.extras import LogicalReplicationConnection

    table = TableName.parse(relay.table)
    producer = TransactionalProducer({**client_config, "transactional.id": relay.transactional_id})
    producer.init()                                                                # step 1
    admin = AdminClient(client_config)
    if relay.offsets_topic not in admin.list_topics(timeout=15).topics:
        for future in admin.create_topics([NewTopic(relay.offsets_topic, 1, relay.replication_factor or -1,
                                                    config=OFFSETS_TOPIC_CONFIG)]).values():
            future.result(30)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    stream = psycopg2.connect(dsn, connection_factory=LogicalReplicationConnection)
    try:
        with conn.cursor() as cur:                                                 # step 2
            cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (relay.slot_name,))
            row = cur.fetchone()
            if row is not None and row[0] is not None:
                raise TerminalError(f"replication slot {relay.slot_name!r} is in use by server process {row[0]}: "
                                    "stop the relay (and anything else streaming from it), then run this again")
            if row is not None:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (relay.slot_name,))
        replication = stream.cursor()
        source = identify(replication, relay.slot_name)
        replication.execute(f'CREATE_REPLICATION_SLOT "{relay.slot_name}" LOGICAL pgoutput (SNAPSHOT \'export\')')
        _, consistent_point, snapshot, _ = replication.fetchone()
        conn.autocommit = False
        with conn.cursor() as cur:                                                 # step 3
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
            cur.execute(f"SELECT xmin::text, array_agg(id::text ORDER BY created_at, id) FROM {table.sql} "
                        "GROUP BY xmin::text ORDER BY min(created_at), xmin::text")
            groups: list[tuple[str, list[str]]] = cur.fetchall()
        conn.commit()
        stream.close()  # the snapshot has done its work
        rows = 0
        for _, ids in groups:
            with conn.cursor() as cur:
                cur.execute(f"WITH moved AS (DELETE FROM {table.sql} WHERE id = ANY(%s::uuid[]) RETURNING *) "
                            f"INSERT INTO {table.sql} SELECT * FROM moved", (ids,))
                rows += cur.rowcount
            conn.commit()
    finally:
        stream.close()
        conn.close()
    start = parse_lsn(consistent_point)
    position = Position(start, 0, datetime.now(UTC).isoformat(), source)          # step 4
    partitions = len(admin.list_topics(relay.offsets_topic, timeout=15).topics[relay.offsets_topic].partitions)
    producer.run(lambda p: p.produce(relay.offsets_topic, key=relay.id.encode(), value=position.to_json(relay.id),
                                     partition=offsets_partition(relay.id, partitions)),
                 what=f"resetting relay {relay.id}'s position")
    producer.close()
    return ResetReport(relay.slot_name, format_lsn(start), rows, len(groups))
