"""The offset store and the commit protocol: rows and Kafka offsets in one Delta commit (G1, G2, G5)."""
