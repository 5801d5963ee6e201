"""Kafka headers the relay stamps on every event, read back by the ingest (G3).

``id`` and ``type`` are Debezium's outbox names. The ``tidemark.*`` headers describe the
source transaction the event came from, so a consumer can tell whether it holds all of
that transaction's events for the topics it reads:

* ``tidemark.txid``: the PostgreSQL transaction id;
* ``tidemark.lsn``: the transaction's commit LSN, unique and increasing in commit order;
* ``tidemark.position``: the event's index in the transaction, 0-based;
* ``tidemark.size``: how many events the transaction has;
* ``tidemark.topic_counts``: JSON object, topic -> how many of them went to that topic.
"""

EVENT_ID = "id"
EVENT_TYPE = "type"
TXID = "tidemark.txid"
LSN = "tidemark.lsn"
POSITION = "tidemark.position"
SIZE = "tidemark.size"
TOPIC_COUNTS = "tidemark.topic_counts"
