"""Kafka headers the relay stamps on every event, read back by the ingest (G3).

``id`` and ``type`` are Debezium's outbox names. The ``tidemark.*`` headers describe the
source transaction the event came from, so a consumer can tell whether it holds all of
that transaction's events for the topics it reads:

* ``tidemark.txid``: the PostgreSQL transaction id;
* ``tidemark.lsn``: the transaction's commit LSN, unique and increasing in commit order;
* ``tidemark.position``: the event's index in the transaction, 0-based;
* ``tidemark.size``: how many events the transaction has;
* ``tidemark.topic_counts``: JSON object, topic -> how many of them went to that topic;
* ``tidemark.source``: ``<relay id>:<commit LSN as 16 hex digits>``: which relay's manifest
  lists the transaction, and where it stands in that relay's commit order. Fixed width, so
  text order is commit order: an ingest cut from the manifest checks its write with one
  range comparison per relay.
"""

EVENT_ID = "id"
EVENT_TYPE = "type"
TXID = "tidemark.txid"
LSN = "tidemark.lsn"
POSITION = "tidemark.position"
SIZE = "tidemark.size"
TOPIC_COUNTS = "tidemark.topic_counts"
SOURCE = "tidemark.source"


def source(relay_id: str, commit_lsn: int) -> str:
    """The ``tidemark.source`` value of a transaction."""
    return f"{relay_id}:{commit_lsn:016X}"
