"""`tidemark outbox` and `tidemark relay`: the application's outbox table and the relay that drains it."""

from __future__ import annotations

import argparse

from tidemark.cli.context import CONFIG, metrics_arguments, relay_of, serve_metrics
from tidemark.cli.output import table
from tidemark.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    outbox = sub.add_parser("outbox", help="the application's outbox table")
    outbox_sub = outbox.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = outbox_sub.add_parser("init", parents=[CONFIG],
                                 help="create the outbox table, its publication and replication slot "
                                              "(idempotent)")
    init.add_argument("--reset-relay", action="store_true",
                      help="recovery (docs/runbooks.md, 'Relay recovery'): recreate the slot, requeue the outbox "
                           "rows that remain, and start the relay's position there")
    relay = sub.add_parser("relay", help="the outbox relay: committed outbox rows to Kafka, exactly once")
    relay_sub = relay.add_subparsers(dest="action", required=True, metavar="ACTION")
    run = relay_sub.add_parser("run", parents=[CONFIG],
                               help="relay until SIGTERM (one source transaction per Kafka transaction)")
    run.add_argument("--idle-exit", type=float, metavar="SECONDS",
                     help="stop after this long without a new transaction (for batch use and tests)")
    run.add_argument("--partitions", type=int, help="partitions of event topics the relay creates "
                                                    "(default relay.topic_partitions, else the cluster's)")
    run.add_argument("--replication-factor", type=int, help="of topics the relay creates "
                                                            "(default relay.replication_factor, else the cluster's)")
    metrics_arguments(run)
    status = relay_sub.add_parser("status", parents=[CONFIG],
                                  help="position, slot, lag in events and seconds")
    dead = relay_sub.add_parser("dead-letter", parents=[CONFIG],
                                help="acknowledge a refused source transaction: move it whole to "
                                                    "the dead letters, so the relay skips it")
    dead.add_argument("--xid", type=int, required=True, help="the transaction id the relay's error named")
    dead.add_argument("--reason", default="acknowledged by an operator (tidemark relay dead-letter)")
    for p, func in ((init, cmd_outbox_init), (run, cmd_relay_run), (status, cmd_relay_status),
                    (dead, cmd_relay_dead_letter)):
        p.add_argument("--relay-id", help="overrides relay.id of the config")
        p.set_defaults(func=func)


def cmd_outbox_init(args: argparse.Namespace) -> int:
    from outbox.schema import TableName, init_outbox

    config, dsn, client = relay_of(args)
    relay = config.relay
    created = init_outbox(dsn, table=TableName.parse(relay.table), publication=relay.publication_name,
                          slot=relay.slot_name, create_slot=not args.reset_relay, payload=relay.payload_column)
    print(f"outbox {relay.table}: " + (", ".join(f"created {c}" for c in created) or "already set up"))
    if args.reset_relay:
        from outbox.reset import reset_relay

        done = reset_relay(relay, dsn=dsn, client_config=client)
        print(f"relay {relay.id} reset: slot {done.slot} recreated at {done.start_lsn}; {done.requeued_rows} outbox "
              f"row(s) of {done.requeued_transactions} source transaction(s) requeued; position moved to "
              f"{done.start_lsn}")
    print(f"next: add events with outbox.schema.add_event(...) and run `tidemark relay run --relay-id {relay.id}`")
    return 0


def cmd_relay_dead_letter(args: argparse.Namespace) -> int:
    import psycopg2

    from outbox.deadletter import dead_letter_transaction
    from outbox.schema import TableName

    config, dsn, _ = relay_of(args)
    relay = config.relay
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            moved = dead_letter_transaction(cur, TableName.parse(relay.table), TableName.parse(relay.dead_letter_table),
                                            args.xid, args.reason)
            cur.execute(f"SELECT count(*) FROM {TableName.parse(relay.dead_letter_table).sql} "
                        "WHERE xid = %s", (args.xid,))
            total = int(cur.fetchone()[0])
    finally:
        conn.close()
    if total == 0:
        raise ConfigError(f"no outbox row of source transaction {args.xid} in {relay.table}: check the xid the "
                          "relay's error named (it may be relayed or dead-lettered already)")
    print(f"source transaction {args.xid}: {total} event(s) in {relay.dead_letter_table} ({moved} copied now); "
          f"restart the relay (`tidemark relay run`): it skips the transaction and deletes its outbox rows")
    return 0


def cmd_relay_run(args: argparse.Namespace) -> int:
    import json

    from outbox.relay import Relay
    from tidemark.signals import stop_on_signals

    config, dsn, client = relay_of(args)
    from outbox.encoding import encoder_for
    from tidemark.settings import load_settings

    encoder = encoder_for(config.relay, config.schema_registry, load_settings())
    relay = Relay(config.relay, dsn=dsn, client_config=client, replication_factor=args.replication_factor,
                  topic_partitions=args.partitions, encoder=encoder)
    metrics = serve_metrics(args)
    if metrics is not None:
        metrics.watch_relay(config.relay, dsn, live=relay)
    report = relay.run(stop_on_signals(), idle_exit=args.idle_exit)
    print(json.dumps({"relay": config.relay.id, "transactions": report.transactions, "events": report.events,
                      "kafka_transactions": report.kafka_transactions, "skipped_redelivered": report.skipped,
                      "deleted_rows": report.deleted, "dead_lettered": report.dead_lettered,
                      "redone": report.redone, "refenced": report.refenced, "outages": report.outages,
                      "registry_outages": report.registry_outages,
                      "topics": dict(report.topics)}))
    return 0


def cmd_relay_status(args: argparse.Namespace) -> int:
    from outbox.status import relay_status
    from tidemark.settings import load_settings

    config, dsn, client = relay_of(args)
    status = relay_status(config.relay, dsn=dsn, client_config=client, registry=config.schema_registry,
                          settings=load_settings())
    print(table(list(status.items()), ("relay", "state")))
    return 0
