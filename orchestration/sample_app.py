"""The demo's application: an order service committing business changes with outbox events.

Each database transaction places, pays or ships an order and adds the matching events
(``order``, ``payment``, ``shipment``) to the outbox in the same transaction, 1 to 4
events across the three types. About one in eight is rolled back, as an application
changes its mind: those events must never reach Kafka or Delta. The app records what it
committed, so the demo can compare the database's truth with the topics and the table.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from outbox.schema import add_event


@dataclass
class AppLedger:
    """What the application committed: the ground truth the demo checks against."""

    events: set[str] = field(default_factory=set)
    transactions: int = 0
    rolled_back: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class SampleApp:
    def __init__(self, dsn: str, table: str, *, threads: int = 2, pause: float = 0.05, seed: int = 7) -> None:
        self.dsn = dsn
        self.table = table
        self.threads = threads
        self.pause = pause
        self.seed = seed
        self.ledger = AppLedger()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def _transaction(self, conn: object, rng: random.Random, order: int) -> None:
        events: list[tuple[str, str, dict[str, object]]] = [
            ("order", "order.placed", {"order_id": order, "amount": round(rng.uniform(5, 500), 2)})]
        if rng.random() < 0.8:
            events.append(("payment", "payment.captured", {"order_id": order, "amount": events[0][2]["amount"]}))
        if rng.random() < 0.6:
            events.append(("shipment", "shipment.created",
                           {"order_id": order, "carrier": rng.choice(["dhl", "ups", "postnl"])}))
        if rng.random() < 0.2:
            events.append(("order", "order.confirmed", {"order_id": order}))
        with conn.cursor() as cur:  # type: ignore[attr-defined]
            ids = [str(add_event(cur, kind, f"order-{order}", etype, payload, table=self.table))
                   for kind, etype, payload in events]
        if rng.random() < 0.125:
            conn.rollback()  # type: ignore[attr-defined]
            with self.ledger.lock:
                self.ledger.rolled_back += 1
            return
        conn.commit()  # type: ignore[attr-defined]
        with self.ledger.lock:
            self.ledger.events.update(ids)
            self.ledger.transactions += 1

    def _loop(self, index: int) -> None:
        import psycopg2

        rng = random.Random(self.seed * 100 + index)
        try:
            conn = psycopg2.connect(self.dsn)
            try:
                order = index
                while not self._stop.is_set():
                    self._transaction(conn, rng, order)
                    order += self.threads
                    time.sleep(rng.uniform(0, 2 * self.pause))
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)

    def start(self) -> SampleApp:
        self._workers = [threading.Thread(target=self._loop, args=(i,), daemon=True, name=f"app-{i}")
                         for i in range(self.threads)]
        for w in self._workers:
            w.start()
        return self

    def stop(self) -> AppLedger:
        self._stop.set()
        for w in self._workers:
            w.join(30)
        if self.errors:
            raise RuntimeError(f"the sample application failed: {self.errors[0]!r}") from self.errors[0]
        return self.ledger
