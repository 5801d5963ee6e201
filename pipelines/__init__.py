"""The PySpark jobs: batch ingest, continuous ingest, backfill; transforms, dedup, quarantine."""
