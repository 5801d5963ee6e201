"""Source transactions in a batch (G3): the relay's headers read in Spark and in Python,
and the reads of Kafka a batch's cut is decided from.

A package, one concern a module, because G3's Kafka-side work has five parts that change
for different reasons: :mod:`.headers` (the ``_tidemark_txn`` columns and the guard, and
the same reading in Python), :mod:`.scanning` (the records' headers read for a cut),
:mod:`.starts` (a first batch's starts moved off a transaction), :mod:`.manifest` with
:mod:`.manifest_records` and :mod:`.consumers` (the relay's manifest read for a cut), and
:mod:`.plan` (the steps of a batch's plan; the decision itself is :mod:`offsets.cut`'s).

The names below are the package's entry points, for callers that name the package
(``pipelines.ingest``; ``bench/``, which also measures revisions from before the split);
new code imports from the owning module.
"""

from offsets.cut import IncompleteTransactionError, ManifestRead, RelayRanges
from pipelines.transactions.consumers import ManifestConsumers
from pipelines.transactions.headers import (
    HEADERS_COLUMN,
    TXN_COLUMN,
    event_header,
    guard,
    header,
    topic_filter,
    txn_headers,
    txn_of,
    txn_struct,
)
from pipelines.transactions.manifest import listed_ranges, read_manifest
from pipelines.transactions.plan import Planner, cut, cut_listed
from pipelines.transactions.scanning import probe, scan, search, spans
from pipelines.transactions.starts import pulled_back, whole_starts

__all__ = [
    "HEADERS_COLUMN",
    "TXN_COLUMN",
    "IncompleteTransactionError",
    "ManifestConsumers",
    "ManifestRead",
    "Planner",
    "RelayRanges",
    "cut",
    "cut_listed",
    "event_header",
    "guard",
    "header",
    "listed_ranges",
    "probe",
    "pulled_back",
    "read_manifest",
    "scan",
    "search",
    "spans",
    "topic_filter",
    "txn_headers",
    "txn_of",
    "txn_struct",
    "whole_starts",
]
