"""Kafka I/O: admin (topics, LSO), exact-range reads, the transactional producer, config mapping."""
