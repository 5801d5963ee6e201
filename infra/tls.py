"""Throwaway TLS material for a secured embedded stack: a CA, the brokers' certificate, and
one client certificate per principal — generated locally with ``cryptography``, no download.

Everything lives in one directory (mode 0700, files 0600) under ``TIDEMARK_HOME``; it is
made once and reused, so clients configured against it keep working across restarts. A
principal's client certificate carries its name as CN, which the broker maps to
``User:<name>`` (``ssl.principal.mapping.rules``), the same principal SCRAM gives it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

#: How long generated certificates are valid: a local stack, not a PKI.
VALIDITY = dt.timedelta(days=825)


@dataclass(frozen=True)
class Pem:
    certificate: Path
    key: Path

    @property
    def combined(self) -> Path:
        """Key then certificate chain in one file: the Java PEM keystore's form."""
        return self.certificate.with_name(self.certificate.stem.removesuffix(".crt") + ".keystore.pem")


def write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path``, readable by its owner only from its first byte (its directory 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class LocalCA:
    """A CA under ``directory`` that signs the broker's and the clients' certificates."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def certificate(self) -> Path:
        return self.directory / "ca.crt"

    def _ca(self):  # type: ignore[no-untyped-def]
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key_path = self.directory / "ca.key"
        if key_path.exists() and self.certificate.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            return key, x509.load_pem_x509_certificate(self.certificate.read_bytes())
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        # A name of its own: a verifier looks issuers up by name, and two local CAs must not meet.
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Tidemark local CA {os.urandom(4).hex()}")])
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        write_private(self.certificate, cert.public_bytes(serialization.Encoding.PEM))
        return key, cert

    def issue(self, name: str, *, server: bool = False, valid: dt.timedelta = VALIDITY,
              directory: Path | None = None, key_password: str | None = None) -> Pem:
        """A certificate with CN ``name`` (and, for a server, SANs for the loopback address
        and ``localhost``), reused if already issued. ``valid`` may be negative: an expired one.
        ``key_password`` encrypts the key file (PKCS#8), as a careful operator's would be."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        where = directory or self.directory
        pem = Pem(where / f"{name}.crt", where / f"{name}.key")
        if pem.certificate.exists() and pem.key.exists() and pem.combined.exists():
            return pem
        ca_key, ca_cert = self._ca()
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start, end = (now - dt.timedelta(minutes=5), now + valid) if valid > dt.timedelta(0) else (
            now + 2 * valid, now + valid)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(ca_cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(
                       [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server
                       else [ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.BestAvailableEncryption(key_password.encode()) if key_password
                                    else serialization.NoEncryption())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        write_private(pem.key, key_pem)
        write_private(pem.certificate, cert_pem)
        write_private(pem.combined, key_pem + cert_pem)
        return pem
