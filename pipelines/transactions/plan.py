"""A batch's G3 plan, step by step: gather the facts from Kafka, then decide in one call.

The decision itself is pure and lives in :mod:`offsets.cut` (:func:`offsets.cut.decide`);
the reads live beside this module (:mod:`~pipelines.transactions.scanning`,
:mod:`~pipelines.transactions.manifest`). What is left is the order of the steps, which is
the plan a reader wants to see in one place, and the report of what was decided.

From the manifest (:func:`cut_listed`), its read is the facts: one decision follows. From
the records (:func:`cut`), a second read depends on a first decision: the scan shows
which transactions the proposal holds only part of, :func:`offsets.cut.searches` says
where their missing events could be, and the search reads there before the decision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from connectors.admin import PartitionBounds
from offsets.cut import Decision, ManifestRead, Scanned, decide, searches
from offsets.ledger import TP, Intent, Wait
from pipelines.transactions.scanning import scan, search
from tidemark.config import PipelineConfig

log = logging.getLogger(__name__)


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
