"""A throwaway CA for mutual-TLS tests: certificates made at test time, never committed."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gputopo.runtime.tls import TlsFiles

__all__ = ["TestCA"]

_KEY = serialization.PrivateFormat.PKCS8
_PEM = serialization.Encoding.PEM


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class TestCA:
    """A CA whose `issue` writes tls.crt, tls.key, ca.crt (the cert-manager layout)."""

    __test__ = False

    def __init__(self, cn: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(_name(cn))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def issue(self, directory: Path, cn: str, *, organizations: Sequence[str] = ()) -> TlsFiles:
        """A certificate for `cn`, with an O= for each of `organizations` (Kubernetes groups)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name(
            [
                *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations),
                *_name(cn),
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.DNSName(cn)]),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        files = TlsFiles(directory / "tls.crt", directory / "tls.key", directory / "ca.crt")
        files.cert.write_bytes(cert.public_bytes(_PEM))
        files.key.write_bytes(key.private_bytes(_PEM, _KEY, serialization.NoEncryption()))
        files.ca.write_bytes(self.cert.public_bytes(_PEM))
        return files
