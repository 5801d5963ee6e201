"""The outbox table, change capture in commit order, and the exactly-once relay daemon (G4)."""
