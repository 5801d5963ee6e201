"""Great Expectations suites, transaction-completeness checks and reconciliation against Kafka."""
