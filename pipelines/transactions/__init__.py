"""Source transactions in a batch (G3): the relay's headers read in Spark and in Python,
and the reads of Kafka a batch's cut is decided from.

A package, one concern a module, because G3's Kafka-side work has five parts that change
for different reasons: :mod:`.headers` (the ``_tidemark_txn`` columns and the guard, and
the same reading in Python), :mod:`.scanning` (the records' headers read for a cut),
:mod:`.starts` (a first batch's starts moved off a transaction), :mod:`.manifest` with
:mod:`.manifest_records` and :mod:`.consumers` (the relay's manifest read for a cut), and
:mod:`.plan` (the steps of a batch's plan; the decision itself is :mod:`offsets.cut`'s).

Callers import from the owning module; the package itself exports nothing.
"""
