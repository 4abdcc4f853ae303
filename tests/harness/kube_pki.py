"""Throwaway credentials for a test API server.

A CA, a serving certificate, a service-account key pair and a static token file.

Everything is made fresh per server, lives in the server's work dir and is valid for a few days:
nothing here is a secret worth protecting, but key files are still written 0600 so that tools
which check permissions do not complain. Keys are ECDSA P-256 because they are generated in
microseconds (RSA-2048 takes tens of milliseconds each) and Go's TLS and service-account token
signer accept them.
"""

from __future__ import annotations

import csv
import datetime
import ipaddress
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ADMIN_USER = "admin"
ADMIN_GROUPS = ("system:masters",)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
# The first address of the service range: the `kubernetes` Service would get it.
_KUBERNETES_SERVICE_IP = "10.0.0.1"
_SERVING_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_SERVING_IPS = ("127.0.0.1", _KUBERNETES_SERVICE_IP)
_VALIDITY = datetime.timedelta(days=7)
# Certificates start a little in the past so a clock that is slightly off does not reject them.
_BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class Pki:
    """Paths of the files the API server is started with."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    service_account_public_key: Path
    service_account_private_key: Path


@dataclass(frozen=True)
class StaticUser:
    """A user of the static token file: its bearer token and its groups."""

    name: str
    token: str
    groups: tuple[str, ...]


def make_pki(directory: Path) -> Pki:
    """Write a fresh CA, serving cert and service-account key pair into `directory`.

    The serving cert is for 127.0.0.1 and localhost (and the in-cluster names of the
    `kubernetes` Service); `directory` is created if missing.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    ca_cert = _ca_certificate(ca_key)
    serving_key = _new_key()
    serving_cert = _serving_certificate(serving_key, ca_key, ca_cert)
    sa_key = _new_key()
    pki = Pki(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        service_account_public_key=directory / "sa.pub",
        service_account_private_key=directory / "sa.key",
    )
    _write(pki.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(pki.serving_cert, serving_cert.public_bytes(serialization.Encoding.PEM))
    _write(pki.serving_key, _private_pem(serving_key), secret=True)
    _write(pki.service_account_private_key, _private_pem(sa_key), secret=True)
    _write(pki.service_account_public_key, _public_pem(sa_key))
    return pki


def make_users(groups_by_user: Mapping[str, Sequence[str]]) -> dict[str, StaticUser]:
    """Give every user a random bearer token; the admin (in `system:masters`) is always added."""
    if ADMIN_USER in groups_by_user:
        raise ValueError(f"user {ADMIN_USER!r} is reserved for the harness's admin")
    wanted = {ADMIN_USER: ADMIN_GROUPS, **{u: tuple(g) for u, g in groups_by_user.items()}}
    return {
        name: StaticUser(name=name, token=secrets.token_urlsafe(24), groups=tuple(groups))
        for name, groups in wanted.items()
    }


def write_token_file(path: Path, users: Mapping[str, StaticUser]) -> None:
    """Write `--token-auth-file`: CSV rows of token, user name, uid, "group1,group2"."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        for user in users.values():
            row = [user.token, user.name, user.name]
            if user.groups:
                row.append(",".join(user.groups))
            writer.writerow(row)
    path.chmod(0o600)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - _BACKDATE, now + _VALIDITY


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gputopo-test-ca")])
    not_before, not_after = _validity()
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _serving_certificate(
    key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
) -> x509.Certificate:
    not_before, not_after = _validity()
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in _SERVING_DNS_NAMES]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVING_IPS]
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
    """Write `data`; a secret file is created 0600 rather than narrowed after the fact."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
