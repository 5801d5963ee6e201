"""Three-broker mode: RF 3, min.insync.replicas 2; transactions survive the loss of one broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tests.kafka_helpers import read_all, transactional_producer, write_transaction
from tests.relay_harness import RelaySetup, Writers, assert_relayed_exactly_once
from tests.stack_fixtures import kafka_cluster
from tidemark.settings import Settings


@pytest.mark.slow
def test_transactions_commit_with_one_of_three_brokers_down(settings: Settings, tmp_path: Path,
                                                            postgres_dsn: str) -> None:
    if settings.kafka.bootstrap_servers:
        pytest.skip("uses the embedded three-broker cluster")
    with kafka_cluster(settings, tmp_path / "kafka3", brokers=3) as (bootstrap, cluster):
        assert cluster is not None
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("rf3", 3, 3)])["rf3"].result(60)
        described = admin.list_topics("rf3", timeout=10).topics["rf3"].partitions
        assert all(len(p.replicas) == 3 for p in described.values())

        producer = transactional_producer(bootstrap, "rf3-writer")
        write_transaction(producer, "rf3", [b"before-%d" % i for i in range(30)], commit=True)

        cluster.kill_node(3)  # SIGKILL: no controlled shutdown
        write_transaction(producer, "rf3", [b"during-%d" % i for i in range(30)], commit=True)
        write_transaction(producer, "rf3", [b"aborted-%d" % i for i in range(10)], commit=False)
        cluster.start_node(3)

        values = sorted(r.value for r in read_all(bootstrap, "rf3") if r.value)
        expected = sorted([b"before-%d" % i for i in range(30)] + [b"during-%d" % i for i in range(30)])
        assert values == expected

        # The relay creates every topic in the shape its config gives (what `serve --relay` runs too).
        setup = RelaySetup.create(tmp_path, postgres_dsn, bootstrap, topic_partitions=None,
                                  replication_factor=3, min_insync_replicas=2)
        writers = Writers(setup, threads=1, rollback_rate=0, late_rate=0, seed=3)
        import random

        with setup.connect() as conn:
            for _ in range(5):
                writers.transaction(conn, random.Random(3))
        setup.drain()
        assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back)
        made = [*setup.event_topics(), setup.offsets_topic, setup.manifest_topic]
        for topic in made:
            assert all(len(p.replicas) == 3 for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values())
        configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in made])
        for resource, future in configs.items():
            assert future.result(30)["min.insync.replicas"].value == "2", resource
