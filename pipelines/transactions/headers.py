"""A record's source transaction, read from the relay's headers: as Spark columns and in Python.

The write needs it per row, inside Spark's generated code (``_tidemark_txn``, and the
guard that rejects a torn transaction); the driver's reads (the planning scan, the search
past a proposal, a first batch's starts) need it in Python, where a Spark column cannot
go. Both readings live here, side by side, because they must give the same answer for
every record, malformed and foreign headers included: a test holds them equal, and a cut
that read a header differently from the audit would disagree with it.

Every event the relay writes names its source transaction (``outbox.wire``). Here
that becomes ``_tidemark_txn``, a struct of the transaction's id, the event's position,
the declared size and how many events it declares for *this pipeline's* topics; a
record without all of those headers (not from the relay) is its own transaction and
gets null.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from offsets.cut import RelayRanges
from offsets.frames import Guard
from outbox import wire
from tidemark.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import Column

TXN_COLUMN = "_tidemark_txn"


def header(name: str) -> Column:
    """The first value of Kafka header ``name`` as text, or null.

    Found by position in the header keys, not with a higher-order function: those are
    evaluated interpreted and take the whole projection out of Spark's generated code,
    which copies every row once more per projection (see :func:`txn_headers`).
    """
    from pyspark.sql import functions as F

    headers = F.col("headers")
    first = F.get(headers["value"], F.array_position(headers["key"], name) - 1)  # position 0: null
    return F.when(F.size(headers) > 0, first.cast("string"))


HEADERS_COLUMN = "_tidemark_headers"
#: What ``tidemark_txn_headers`` reads, in the order it takes them.
_TXN_HEADERS = (wire.TXID, wire.LSN, wire.POSITION, wire.SIZE, wire.SOURCE)

def event_header(pipeline: PipelineConfig) -> str | None:
    """The header a pipeline's event id comes from (``event_id: header:<name>``), or None."""
    return pipeline.event_id.removeprefix("header:") if pipeline.event_id.startswith("header:") else None


def txn_headers(pipeline: PipelineConfig, fast: bool = False) -> Column:
    """``_tidemark_headers``: the record's source transaction as the relay's headers give it.

    A struct of ``txn``: the record's ``_tidemark_txn`` (:func:`txn_struct`) before any
    release, null unless the relay's headers give it an id (``<lsn>/<txid>``), a position
    and a size above 0 (``try_cast`` to INT); its ``expected`` is the sum of
    ``topic_counts`` over this pipeline's topics, or the size when that header is missing or
    unreadable. Then ``source`` (text), which :func:`guard` compares, and ``event``: the
    pipeline's event id header as :func:`header` reads it (null if its event id is not a
    header), so that a G3 pipeline reads each record's headers once, not once more for the
    event id.
    Read with ``from_json`` and higher-order functions, which Spark evaluates interpreted, it was G3's largest
    per-record cost; so with ``fast`` (the session has Tidemark's functions,
    ``infra.udfs``) one pass over the headers, ``tidemark_txn_headers``, reads them all and
    the relay's own compact form of the counts, and only a record in any other form takes
    ``from_json`` (the same answer either way; a test holds them equal).
    :mod:`pipelines.transform` computes this column in the projection that already parses
    the value; everything reading it afterwards (:func:`txn_struct`, :func:`guard`)
    compiles to generated code. Records without headers, most Kafka records, get null at
    the cost of one size check.
    """
    from pyspark.sql import functions as F

    raw = header(wire.TOPIC_COUNTS)
    counts = F.from_json(raw, "map<string,int>")
    if pipeline.topic_pattern is not None:
        pattern = f"^(?:{pipeline.topic_pattern})$"
        mine = F.map_filter(counts, lambda k, v: k.rlike(pattern))
        spec = "P" + pipeline.topic_pattern
    else:
        mine = F.map_filter(counts, lambda k, v: k.isin(*pipeline.topics))
        spec = "L" + "\x01".join(pipeline.topics)
    # try_add: counts whose sum leaves INT (no relay writes them) are unreadable, so null; with
    # `+` Spark's ANSI mode failed the batch's job on them, and every retry of it again.
    counted = F.aggregate(F.map_values(mine), F.lit(0), lambda acc, x: F.try_add(acc, x))
    event = event_header(pipeline)
    if fast:
        # One pass over the headers; `counted` (from_json) only for counts not in the relay's form.
        return F.call_function("tidemark_txn_headers", F.col("headers"), F.lit(spec), F.lit(wire.TOPIC_COUNTS),
                               counted, *[F.lit(h) for h in (*_TXN_HEADERS, *([event] if event is not None else []))])
    txn_id = F.concat(header(wire.LSN), F.lit("/"), header(wire.TXID))
    position, size = header(wire.POSITION).try_cast("int"), header(wire.SIZE).try_cast("int")
    txn = F.when(txn_id.isNotNull() & position.isNotNull() & (size > 0), F.struct(
        txn_id.alias("id"), position.alias("position"), size.alias("size"),
        F.coalesce(counted, size).alias("expected"), F.lit(False).alias("released")))
    return F.when(F.size("headers") > 0, F.struct(
        txn.alias("txn"), header(wire.SOURCE).alias("source"),
        (header(event) if event is not None else F.lit(None).cast("string")).alias("event")))


def txn_struct() -> Column:
    """``_tidemark_txn`` of a row with :func:`txn_headers`: (id, position, size, expected, released=false), or null."""
    from pyspark.sql import functions as F

    return F.col(HEADERS_COLUMN)["txn"]


_INT = re.compile(r"\s*[+-]?[0-9]+\s*")


def _int(raw: bytes | None) -> int | None:
    """A header as an INT the way ``try_cast(... AS INT)`` reads it: digits, in range, else None."""
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace")
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**31) <= value < 2**31 else None


def _counts(raw: bytes | None) -> list[tuple[str, int]] | None:
    """``from_json(counts, 'map<string,int>')``: an object of whole numbers, else None; its pairs
    in order, a repeated key's each (Spark's map keeps them all, and sums them all)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw, object_pairs_hook=_Pairs)
    except ValueError:
        return None
    if not isinstance(data, _Pairs) or not all(type(v) is int and -(2**31) <= v < 2**31 for _, v in data):
        return None
    return list(data)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as :func:`json.loads` reads it with this hook: its pairs, repeats kept."""


def _counted(pairs: list[tuple[str, int]]) -> dict[str, int] | None:
    """Per topic, the counts of ``pairs`` summed in order as ``try_add`` sums them: None once a
    partial sum leaves INT (the column's ``counted`` is then null)."""
    total = 0
    here: dict[str, int] = {}
    for topic, n in pairs:
        total += n
        if not -(2**31) <= total < 2**31:
            return None
        here[topic] = here.get(topic, 0) + n
    return here


def guard(listed: RelayRanges = (), base: Guard | None = None) -> Guard:
    """For a guarded batch's write (offsets.protocol), over rows with :func:`txn_headers`:
    tripped by a record of a multi-event transaction not from one a manifest cut listed
    (``listed``: per relay, the commit LSNs of its listed transactions; every one of that
    relay's transactions in between with an event in the batch is listed, because a
    relay's manifest records follow its commit order). Without ``listed``, exactly the rows
    the planning scan (:mod:`pipelines.transactions.scanning`) would keep, so a batch that
    passes is one whose scan would have found nothing to cut. ``base``: ``guard()`` built before (a pipeline keeps it: each column is
    a py4j round trip), to which only ``listed`` is added.
    """
    from pyspark.sql import functions as F

    h = F.col(HEADERS_COLUMN)
    if base is None:
        txn = h["txn"]
        base = Guard(tripped=F.coalesce(txn["expected"] > 1, F.lit(False)), why=F.concat(
            F.lit("record "), F.col("topic"), F.lit(":"), F.col("partition").cast("string"), F.lit("@"),
            F.col("offset").cast("string"), F.lit(" belongs to multi-event source transaction "), txn["id"]))
    if not listed:
        return base
    # `tidemark.source` is `<relay>:<16 hex digits of the commit LSN>`: text order is commit order.
    inside = F.lit(False)
    for relay, low, high in listed:
        inside = inside | h["source"].between(wire.source(relay, low), wire.source(relay, high))
    return Guard(tripped=base.tripped & ~F.coalesce(inside, F.lit(False)), why=base.why)


def topic_filter(pipeline: PipelineConfig) -> Callable[[str], bool]:
    """Whether a topic named in ``topic_counts`` is one this pipeline reads (as :func:`txn_struct` decides)."""
    if pipeline.topic_pattern is not None:
        matcher = re.compile(f"^(?:{pipeline.topic_pattern})$")
        return lambda topic: matcher.search(topic) is not None
    topics = frozenset(pipeline.topics)
    return topics.__contains__


#: What the events of one transaction share: (id, expected here, per-topic counts here or None).
Shared = tuple[str, int, Mapping[str, int] | None]


def txn_of(headers: list[tuple[str, bytes | None]], mine: Callable[[str], bool],
           memo: dict[tuple[bytes | None, ...], Shared | None] | None = None) -> tuple[str, int, int] | None:
    """(id, position, expected) of a record's source transaction, as :func:`txn_struct` gives them, or None.

    ``memo`` caches what the events of one transaction share (all but the position),
    including its per-topic counts for this pipeline's topics (see :func:`declared`).
    """
    first = dict(reversed(headers))  # the first value of each header, like header()
    shared_key = (first.get(wire.TXID), first.get(wire.LSN), first.get(wire.SIZE), first.get(wire.TOPIC_COUNTS))
    if memo is not None and shared_key in memo:
        shared = memo[shared_key]
    else:
        shared = _shared(*shared_key, mine)
        if memo is not None:
            memo[shared_key] = shared
    position = _int(first.get(wire.POSITION))
    if shared is None or position is None:
        return None
    return shared[0], position, shared[1]


def declared(memo: Mapping[tuple[bytes | None, ...], Shared | None]) -> dict[str, Mapping[str, int] | None]:
    """Per transaction id met by :func:`txn_of`, the events it declares per topic of this pipeline."""
    return {shared[0]: shared[2] for shared in memo.values() if shared is not None}


def _shared(txid: bytes | None, lsn: bytes | None, size_raw: bytes | None, counts_raw: bytes | None,
            mine: Callable[[str], bool]) -> Shared | None:
    size = _int(size_raw)
    if txid is None or lsn is None or size is None or size <= 0:
        return None
    counts = _counts(counts_raw)
    here = None if counts is None else _counted([(topic, n) for topic, n in counts if mine(topic)])
    expected = size if here is None else sum(here.values())
    return f"{lsn.decode('utf-8', 'replace')}/{txid.decode('utf-8', 'replace')}", expected, here
