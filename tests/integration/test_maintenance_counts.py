"""`tidemark maintain`'s report against the store itself: the files it says VACUUM deleted are
the files that left the bucket (or the directory), on every store.

Delta writes the VACUUM commits that carry the count only for some filesystems on its own
(local paths, HDFS, ABFS, GCS: not ``s3a``); a report read from them alone says ``vacuumed: 0``
on S3 while VACUUM empties the table of its replaced files.
"""

from __future__ import annotations

import json

import pytest

from pipelines.ingest import IngestJob
from pipelines.maintain import maintain
from tests.kafka_helpers import settled_lsos, transactional_producer, write_transaction
from tidemark.config import parse_config


def _data_files(path: str) -> set[str]:
    """The table's data files as the store lists them (through its own API: S3's for ``s3a://``)."""
    import pyarrow.fs as pafs

    from tidemark.storage import arrow_filesystem

    fs, root = arrow_filesystem(path)
    listed = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {i.path for i in listed
            if i.type == pafs.FileType.File and i.path.endswith(".parquet") and "/_delta_log/" not in i.path}


@pytest.mark.slow
@pytest.mark.s3  # CI runs it in the S3 stage, on s3a:// tables; locally it runs on local paths
def test_maintain_reports_the_files_vacuum_deleted_from_the_store(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str) -> None:
    topic = topic_factory("maintain-count")
    config = parse_config({"pipelines": [{"name": "orders", "topics": [topic], "target": f"{table_root}/orders",
                                          "schema": "id BIGINT, note STRING",
                                          "maintenance": {"time_travel_hours": 0}}]})
    pipeline = config.pipelines[0]
    producer = transactional_producer(kafka_bootstrap)
    for batch in range(2):
        write_transaction(producer, topic, [json.dumps({"id": batch * 10 + i, "note": "n"}).encode()
                                            for i in range(10)], commit=True)
        settled_lsos(kafka_bootstrap, topic, 1)  # the commit's marker written: below the LSO
        assert IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded().rows == 10

    tables = {"target": pipeline.target, "ledger": pipeline.ledger_path}
    before = {role: _data_files(path) for role, path in tables.items()}
    report = maintain(spark, pipeline)
    after = {role: _data_files(path) for role, path in tables.items()}

    done = {t.role: t for t in report.tables if t.skipped is None}
    assert set(done) == set(tables)  # no bad records: no quarantine
    target = done["target"]
    assert (target.files_before, target.files_after, target.compacted_away) == (2, 1, 2)
    assert len(before["target"] - after["target"]) == 2  # VACUUM deleted both replaced files...
    for role in tables:  # ...and the report says what left the store, table by table
        gone = before[role] - after[role]
        assert done[role].vacuumed == len(gone), (role, done[role], sorted(gone))
