"""`tidemark acls`: the Kafka ACLs the relay and the ingest need, printed or created."""

from __future__ import annotations

import argparse

from tidemark.cli.context import CONFIG


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    acls = sub.add_parser("acls", parents=[CONFIG],
                          help="the Kafka ACLs the relay and the ingest need (kafka-acls commands); "
                                       "--apply creates them")
    acls.add_argument("--relay-principal", metavar="NAME",
                      help="the relay's user (default: relay.kafka_security's user or certificate CN, else relay)")
    acls.add_argument("--ingest-principal", metavar="NAME",
                      help="every pipeline's user (default: each pipeline's kafka_security user or certificate "
                           "CN, else ingest)")
    acls.add_argument("--apply", action="store_true", help="create them, connecting as kafka.security says "
                                                             "(a principal allowed to alter ACLs)")
    acls.set_defaults(func=cmd_acls)


def cmd_acls(args: argparse.Namespace) -> int:
    """The ACLs the relay and the ingest need for this config; with --apply, created."""
    from pathlib import Path

    from connectors.acls import apply, ingest_grants, merged, principal_of, relay_grants
    from connectors.kafka_config import librdkafka_config
    from orchestration.context import load, preflight, resolve_bootstrap
    from tidemark.config import KafkaSecurity, load_config

    # Principals from the config as written: a component's own credentials, else the shared ones,
    # else the embedded cluster's relay and ingest users (not the admin a bare config connects as).
    written = load_config(Path(args.config))
    shared = written.kafka.security if written.kafka.security != KafkaSecurity() else None
    config = load(args.config)
    relay = args.relay_principal or principal_of(written.relay.kafka_security or shared, "relay")
    grants = relay_grants(config, f"User:{relay}")
    for p in written.pipelines:
        user = args.ingest_principal or principal_of(p.kafka_security or shared, "ingest")
        grants += ingest_grants(config, f"User:{user}", only=p.name)
    grants = merged(grants)  # pipelines sharing a principal and topic share one grant
    bootstrap = resolve_bootstrap(config)
    if not args.apply:
        for g in grants:
            print(g.command(bootstrap))
        return 0
    preflight(config, bootstrap)
    apply(librdkafka_config(config.kafka, bootstrap), grants)
    principals = sorted({g.principal for g in grants})
    print(f"created {sum(len(g.operations) for g in grants)} ACL(s) for {', '.join(principals)}")
    return 0
