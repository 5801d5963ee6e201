"""The local stack: JVM jars, an embedded KRaft Kafka, an embedded PostgreSQL, the Spark session.

Everything runs as local processes bound to 127.0.0.1; no Docker engine is needed.
Setting ``TIDEMARK_KAFKA__BOOTSTRAP_SERVERS`` / ``TIDEMARK_POSTGRES__DSN`` points Tidemark
at existing servers instead.
"""
