"""One exception root for all of Tidemark.

Every error raised on purpose derives from :class:`TidemarkError` and carries one of two
markers. :class:`TransientError` means "the same call may succeed later" (a broker that is
restarting, a lock held by another run); orchestration retries it. :class:`TerminalError`
means "retrying cannot help" (bad config, data lost to retention, a fenced writer); it
stops the run and the message says what to do. Callers decide on the marker, never on
message text.
"""

from __future__ import annotations


class TidemarkError(Exception):
    """Root of every error Tidemark raises on purpose."""

    #: Exit code the CLI uses for this error.
    exit_code: int = 1


class TransientError(TidemarkError):
    """The operation may succeed if retried unchanged."""

    exit_code = 75  # EX_TEMPFAIL


class TerminalError(TidemarkError):
    """Retrying cannot help; a person has to act on the message."""

    exit_code = 1


# --- configuration -------------------------------------------------------------------


class ConfigError(TerminalError):
    """A setting is missing or invalid; the message names it and the fix."""

    exit_code = 78  # EX_CONFIG


# --- local stack ---------------------------------------------------------------------


class StackError(TerminalError):
    """The local stack cannot be brought up or used as asked."""


class MissingToolError(StackError):
    """A program the stack needs (java, mvn) is not installed."""


class PortInUseError(StackError):
    """A port the embedded stack wants is held by another process."""


class JarsMissingError(StackError):
    """The JVM jars are not in the local cache and cannot be resolved now."""


class ServiceStartError(StackError):
    """A server process exited or did not become ready; the message points at its log."""


class ServiceUnavailableError(TransientError):
    """A server did not answer in time; it may be starting or restarting."""


class RegistryUnavailableError(ServiceUnavailableError):
    """The schema registry did not answer: a batch that needs it waits (a follower retries)."""


# --- Kafka access ----------------------------------------------------------------------


class AccessDeniedError(TerminalError):
    """A server refused these credentials or this certificate, or an operation no grant allows."""

    exit_code = 77  # EX_NOPERM


class KafkaAccessError(AccessDeniedError):
    """The Kafka cluster refused the login, the TLS handshake, or an operation an ACL does not allow."""


class PostgresAccessError(AccessDeniedError):
    """PostgreSQL refused the login or the TLS handshake."""
