"""The schema registry, as ``format: avro`` pipelines ask it: a subject's versions and a schema by id.

Over Confluent's API (Confluent, Karapace, Apicurio's ``/apis/ccompat/v7``) through
confluent-kafka's client. A schema's id never changes what it names, so schemas are kept
per registry and id for the life of the process. What the registry answers is turned into
Tidemark's errors: a registry that does not answer (or answers 5xx) is transient — the
batch waits and is retried, never decoded with a guessed schema and never quarantined for
it; a refused login is terminal; an id or subject it does not know is an answer (None / no
versions), which the caller decides about.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from tidemark.config import SchemaRegistryConfig
from tidemark.errors import AccessDeniedError, ConfigError, RegistryUnavailableError
from tidemark.settings import Settings

#: ``(registry url, schema id)`` → the schema's text, for the life of the process.
_SCHEMAS: dict[tuple[str, int], str] = {}
#: ``(registry url, schema id)`` → the files its schema imports by schema references, by import name.
_IMPORTS: dict[tuple[str, int], dict[str, str]] = {}
#: ``(registry url, subject, version)`` → its schema id (a version, once registered, keeps its id).
_VERSIONS: dict[tuple[str, str, int], int] = {}
_LOCK = threading.Lock()


def registry_url(config: SchemaRegistryConfig, settings: Settings) -> str:
    """The configured registry, or the embedded one (``TIDEMARK_REGISTRY__PORT``)."""
    return (config.url or f"http://127.0.0.1:{settings.registry.port}/apis/ccompat/v7").rstrip("/")


def client_config(config: SchemaRegistryConfig, url: str) -> dict[str, Any]:
    """confluent-kafka's ``SchemaRegistryClient`` settings (the password read now)."""
    conf: dict[str, Any] = {"url": url, "timeout": 10, "max.retries": 1}
    password = config.password()
    if config.basic_auth_username is not None:
        conf["basic.auth.user.info"] = f"{config.basic_auth_username}:{password or ''}"
    if config.ssl_ca_location is not None:
        conf["ssl.ca.location"] = str(config.ssl_ca_location)
    if config.ssl_certificate_location is not None:
        conf["ssl.certificate.location"] = str(config.ssl_certificate_location)
        conf["ssl.key.location"] = str(config.ssl_key_location)
    return conf


def refusal(url: str, what: str, error: Any, *, waits: str) -> Exception:
    """A registry's HTTP error (confluent-kafka's ``SchemaRegistryError``) as Tidemark's: waited
    out only where asking again can help (5xx, 408, 429), so nothing retries a refusal forever.
    ``waits``: what the caller does meanwhile."""
    status = error.http_status_code
    if status in (401, 403):
        return AccessDeniedError(f"the schema registry at {url} refused {what} (HTTP {status}): check "
                                 "schema_registry.basic_auth_username and its password")
    if status in (408, 429):
        return RegistryUnavailableError(f"the schema registry at {url} answered {what} with HTTP {status} "
                                        f"({error.error_message}); {waits}")
    if status is not None and status < 500:  # the same request would be refused again: not worth a wait
        return ConfigError(f"the schema registry at {url} refused {what} with HTTP {status} "
                           f"({error.error_message}); check that schema_registry.url is a Confluent-"
                           "compatible API (Apicurio's is at /apis/ccompat/v7), then run again")
    return RegistryUnavailableError(f"the schema registry at {url} failed {what} (HTTP {status}); {waits}")


def unreachable(url: str, error: BaseException, *, waits: str) -> Exception:
    """A registry that could not be asked (``error``: httpx's or the OS's) as Tidemark's error:
    a wait, but for a certificate the client does not trust, which no wait mends."""
    if "CERTIFICATE_VERIFY_FAILED" in str(error) or "certificate verify failed" in str(error):
        return ConfigError(f"the schema registry at {url} presents a certificate this client does not trust "
                           f"({error}); set schema_registry.ssl_ca_location to the CA that signed it, then run again")
    return RegistryUnavailableError(f"the schema registry at {url} does not answer ({type(error).__name__}: {error}); "
                                    f"{waits}")


@dataclass(frozen=True)
class Version:
    version: int
    schema_id: int


class Registry:
    def __init__(self, config: SchemaRegistryConfig, settings: Settings) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = registry_url(config, settings)
        self._client = SchemaRegistryClient(client_config(config, self.url))

    def _ask(self, what: str, call: Any) -> Any:
        """``call()``, its failures as Tidemark's errors; a 404 answers None."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call()
        except SchemaRegistryError as error:
            if error.http_status_code == 404:
                return None
            raise refusal(self.url, what, error, waits="the batch waits and is tried again") from None
        except Exception as error:  # noqa: BLE001 - httpx's and the OS's connection failures
            raise unreachable(self.url, error, waits="the batch waits and is tried again (schema_registry.url, or "
                              "`tidemark stack up` for the embedded one)") from None

    def versions(self, subject: str) -> list[Version]:
        """Every version of ``subject``, oldest first (none if the registry does not know it)."""
        numbers = self._ask(f"the versions of subject {subject!r}", lambda: self._client.get_versions(subject))
        found = []
        for number in numbers or ():
            with _LOCK:
                known = _VERSIONS.get((self.url, subject, int(number)))
            if known is not None:
                found.append(Version(int(number), known))
                continue
            registered = self._ask(f"version {number} of subject {subject!r}",
                                   lambda n=number: self._client.get_version(subject, n))
            if registered is not None:
                found.append(Version(int(registered.version), int(registered.schema_id)))
                with _LOCK:
                    _VERSIONS[(self.url, subject, int(registered.version))] = int(registered.schema_id)
                    _SCHEMAS.setdefault((self.url, int(registered.schema_id)), registered.schema.schema_str)
        return sorted(found, key=lambda v: v.version)

    def schema(self, schema_id: int) -> str | None:
        """The schema ``schema_id`` names (kept once read), or None if the registry does not know it."""
        with _LOCK:
            kept = _SCHEMAS.get((self.url, schema_id))
        if kept is not None:
            return kept
        found = self._ask(f"schema id {schema_id}", lambda: self._client.get_schema(schema_id))
        if found is None:
            return None
        with _LOCK:
            _SCHEMAS[(self.url, schema_id)] = found.schema_str
        return str(found.schema_str)

    def imports(self, schema_id: int) -> dict[str, str] | None:
        """The schemas ``schema_id``'s schema references name (a Protobuf schema's imports of other
        subjects), by the name it imports each under, and those they name in turn; None if the
        registry does not know the id."""
        with _LOCK:
            kept = _IMPORTS.get((self.url, schema_id))
        if kept is not None:
            return kept
        found = self._ask(f"schema id {schema_id}", lambda: self._client.get_schema(schema_id))
        if found is None:
            return None
        files: dict[str, str] = {}
        self._follow(found.references or [], files, f"schema id {schema_id}")
        with _LOCK:
            _IMPORTS[(self.url, schema_id)] = files
        return files

    def _follow(self, references: list[Any], files: dict[str, str], what: str) -> None:
        for reference in references:
            if reference.name in files:
                continue
            subject, version = str(reference.subject), int(reference.version)
            registered = self._ask(f"version {version} of subject {subject!r}",
                                   lambda s=subject, v=version: self._client.get_version(s, v))
            if registered is None:
                raise ConfigError(f"{what} imports {reference.name!r} as version {version} of subject {subject!r}, "
                                  f"which the schema registry at {self.url} does not have; register it there, then "
                                  "run again")
            files[str(reference.name)] = str(registered.schema.schema_str)
            self._follow(registered.schema.references or [], files, f"version {version} of subject {subject!r}")
