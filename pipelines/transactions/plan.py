"""A batch's G3 plan, step by step: gather the facts from Kafka, then decide in one call.

The decision itself is pure and lives in :mod:`offsets.cut` (:func:`offsets.cut.decide`);
the reads live beside this module (:mod:`~pipelines.transactions.scanning`,
:mod:`~pipelines.transactions.manifest`). What is left is the order of the steps, which is
the plan a reader wants to see in one place, and the report of what was decided.
:class:`Planner` is the one call a batch's G3 plan is: it chooses between the manifest, a
guarded write and the scan.

From the manifest (:func:`cut_listed`), its read is the facts: one decision follows. From
the records (:func:`cut`), a second read depends on a first decision: the scan shows
which transactions the proposal holds only part of, :func:`offsets.cut.searches` says
where their missing events could be, and the search reads there before the decision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from connectors.admin import PartitionBounds
from offsets.cut import Decision, ManifestRead, RelayRanges, Scanned, decide, searches
from offsets.ledger import TP, Intent, Wait
from pipelines.transactions.consumers import ManifestConsumers
from pipelines.transactions.manifest import listed_ranges, read_manifest
from pipelines.transactions.scanning import probe, scan, search
from tidemark.config import PipelineConfig

log = logging.getLogger(__name__)


class Planner:
    """A pipeline's G3 plan of each batch, in one call (:meth:`decide`): cut from the relay's
    manifest where it lists the proposal's transactions; else written *guarded* when the
    records likely hold no multi-event transaction (the write checks every record); else cut
    from a scan of the records. Keeps what each manifest cut listed, which its write's guard
    lets be (:meth:`listed_for`)."""

    def __init__(self, client_config: Mapping[str, str], pipeline: PipelineConfig) -> None:
        self.client_config = client_config
        self.pipeline = pipeline
        self.reads: ManifestConsumers | None = None
        """The consumers a run's manifest reads share (set for the run by its owner)."""
        self._listed: dict[tuple[int, tuple[object, ...]], RelayRanges] = {}
        """Per batch cut from the manifest (its id and ranges: step 2 may decide several proposals of one
        batch): what it listed."""

    def decide(self, intent: Intent, last: Intent | None, bounds: Mapping[TP, PartitionBounds]) -> Intent:
        """``intent`` cut at source-transaction boundaries, or marked guarded (see the class)."""
        cursor = last.manifest[2] if last is not None and last.manifest is not None else None
        read = read_manifest(self.client_config, self.pipeline, intent, cursor, self.reads)
        if read is not None and read.listed:
            intent = cut_listed(self.pipeline, intent, read, bounds, last)
            self._listed[(intent.batch_id, intent.ranges)] = read.relays
        elif self._guess_no_multi_event(intent, last):
            carried = None if read is None else (read.start, read.end, read.next_cursor(intent.ends()))
            intent = replace(intent, guarded=True, waiting=last.waiting if last else {}, manifest=carried)
            self._listed[(intent.batch_id, intent.ranges)] = ()
        else:
            intent = cut(self.client_config, self.pipeline, intent, bounds, last)
        return intent

    def revise(self, proposal: Intent, last: Intent | None, bounds: Mapping[TP, PartitionBounds]) -> Intent:
        """A guarded batch whose write met a multi-event transaction, proposed again: the scan and cut."""
        return cut(self.client_config, self.pipeline, proposal, bounds, last)

    def listed_for(self, intent: Intent) -> RelayRanges:
        """What the manifest listed for a batch cut from it (read again for a batch planned by another run)."""
        if not intent.guarded or intent.manifest is None:
            return ()
        key = (intent.batch_id, intent.ranges)
        if key not in self._listed:
            self._listed = {k: v for k, v in self._listed.items() if k[0] >= intent.batch_id}  # older: done
            self._listed[key] = listed_ranges(self.client_config, self.pipeline, intent)
        return self._listed[key]

    def _guess_no_multi_event(self, intent: Intent, last: Intent | None) -> bool:
        """Whether to write ``intent`` guarded rather than scan it first (``transactions.scan: auto``).

        A guess: a batch written guarded predicts another. A pipeline's first batch, and the
        first after a scan that found none, look at the first records of each range
        (:func:`~pipelines.transactions.scanning.probe`, a fraction of a second) before guessing so.
        A wrong guess costs the start of an aborted write and one ledger append, after which
        batches are scanned until one finds none again.
        """
        if self.pipeline.transactions.scan == "always" or (last is not None and last.waiting):
            return False
        if last is not None and last.guarded:
            return True
        if last is not None and last.txns != 0:
            return False
        return not probe(self.client_config, self.pipeline, intent)


def cut(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent,
        bounds: Mapping[TP, PartitionBounds], last: Intent | None) -> Intent:
    """``intent`` cut at source-transaction boundaries from its records, with those missing
    events past their timeout released or refused.

    ``bounds`` are the LSOs up to which a missing event would be readable; ``last`` is the
    batch before, whose waits (:class:`offsets.ledger.Wait`) this one carries on.

    1. Scan the proposal: every multi-event transaction with an event in it (headers only).
    2. Decide where the missing events of those it holds only part of could lie (pure).
    3. Search there, past the proposal and below the LSOs: first for transactions not
       waiting yet, then for those waiting, from where their last search stopped.
    4. Decide the cut from the scan and the search (pure), and report it.
    """
    waits, lso = _carried(last), _lso(bounds)
    # Step 1.
    spans = scan(client_config, pipeline, intent)
    # Step 2.
    wanted = searches(spans, intent.ends(), lso, waits)
    # Step 3.
    found: dict[str, frozenset[int]] = {}
    for part in wanted:
        found |= search(client_config, pipeline, part.regions, part.expected, part.have)
    # Step 4.
    return _reported(pipeline, decide(pipeline.name, pipeline.transactions, intent, lso, waits,
                                      Scanned(tuple(spans), found)))


def cut_listed(pipeline: PipelineConfig, intent: Intent, read: ManifestRead, bounds: Mapping[TP, PartitionBounds],
               last: Intent | None) -> Intent:
    """``intent`` cut from the manifest ``read`` found for it (as :func:`cut` does from the
    records), guarded against the unlisted: the read is the facts, so one decision (pure),
    then its report."""
    return _reported(pipeline, decide(pipeline.name, pipeline.transactions, intent, _lso(bounds), _carried(last),
                                      read))


def _carried(last: Intent | None) -> Mapping[str, Wait]:
    return last.waiting if last else {}


def _lso(bounds: Mapping[TP, PartitionBounds]) -> dict[TP, int]:
    return {tp: b.stable_end for tp, b in bounds.items()}


def _reported(pipeline: PipelineConfig, decision: Decision) -> Intent:
    """The decided intent, after logging what an operator must know of it: releases (an alert) and holds."""
    intent, policy = decision.intent, pipeline.transactions
    if intent.released:
        log.error("ALERT pipeline %s batch %d: releasing %d source transaction(s) whose missing events stayed "
                  "unreadable for %g s or more (longest wait %.0f s), flagged _tidemark_txn.released: %s",
                  pipeline.name, intent.batch_id, len(intent.released), policy.incomplete_timeout_seconds,
                  decision.longest_wait, ", ".join(intent.released[:5]))
    if decision.held:
        log.info("batch %d: %d source transaction(s) not whole in this batch wait for a later one (%d of them "
                 "missing events below the LSO)", intent.batch_id, len(decision.held),
                 sum(1 for t in decision.held if t in intent.waiting))
    return intent
