"""A TLS front for the embedded PostgreSQL, whose wheel is built without OpenSSL.

PostgreSQL negotiates TLS inside its own protocol: the client sends an ``SSLRequest``, the
server answers ``S`` and the TLS handshake follows on the same socket. This front does
exactly that on the public port, with a certificate from the stack's local CA, then relays
the decrypted stream to the server on a loopback port of its own, where ``pg_hba.conf``
still demands a scram-sha-256 password. A client that does not ask for TLS gets the
``FATAL`` a ``hostnossl ... reject`` line would give. So a client configured for
``sslmode=verify-full`` and a password meets what a TLS-enabled server shows it: the
certificate check, the host check, the SCRAM exchange (without channel binding, which
needs TLS at the server itself).

Run as ``python -m infra.pg_tls LISTEN_PORT BACKEND_PORT CERT KEY``; it lives as long as the
stack does (``infra.postgres`` starts and stops it with the server).
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import sys

from infra.process import LOOPBACK

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


def _refusal(message: str) -> bytes:
    fields = b"SFATAL\0VFATAL\0C28000\0M" + message.encode() + b"\0\0"
    return b"E" + struct.pack("!i", len(fields) + 4) + fields


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, backend: int,
                     context: ssl.SSLContext) -> None:
    try:
        head = await reader.readexactly(8)
        length, code = struct.unpack("!ii", head)
        if length == 8 and code == GSSENC_REQUEST:
            writer.write(b"N")
            await writer.drain()
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
        if not (length == 8 and code == SSL_REQUEST):
            writer.write(_refusal("this server accepts TLS connections only (use sslmode=verify-full)"))
            await writer.drain()
            writer.close()
            return
        writer.write(b"S")
        await writer.drain()
        await writer.start_tls(context)
        up_reader, up_writer = await asyncio.open_connection(LOOPBACK, backend)
    except (asyncio.IncompleteReadError, ConnectionError, OSError, ssl.SSLError):
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def serve(listen: int, backend: int, cert: str, key: str) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = await asyncio.start_server(lambda r, w: _serve_one(r, w, backend, context), LOOPBACK, listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen_port, backend_port, cert_file, key_file = sys.argv[1:5]
    asyncio.run(serve(int(listen_port), int(backend_port), cert_file, key_file))
