"""Tidemark: exactly-once ingestion from an application database through Kafka into Delta Lake.

The top-level packages each own one concern (see docs/design.md); this package holds
only what they share: the exception root, the settings and the command line.
"""

__version__ = "0.1.0"
