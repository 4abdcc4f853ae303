"""The certificates gputopo's mutual TLS needs: what each process must hold, made or checked.

Two jobs share one vocabulary (the extended key usages, EKUs, of RFC 5280 4.2.1.12):

- `missing_purposes` reads a certificate and says which EKU it lacks for the way a process uses
  it. OpenSSL refuses such a peer only during the handshake and says `unsupported certificate
  purpose` on the *other* side's log while this side sees `Socket closed`; checked when the
  files are loaded, the process that holds the wrong certificate names the missing EKU itself.
- `issue_bundle` makes a CA and the Secrets the manifests mount (cert-manager's layout:
  `tls.crt`, `tls.key`, `ca.crt`), with the names the processes dial and the EKUs they use, for
  clusters without cert-manager (`gputopo certs`). `deploy/optional/cert-manager/` asks
  cert-manager for the same Secrets; `tests/runtime/test_pki.py` holds the two to one table.

Who uses which purpose: every process serves HTTPS (`/metrics`), so each needs `serverAuth`;
the exporter and the scheduler also dial the aggregator, so they need `clientAuth`; Prometheus
only dials. A certificate with no EKU extension is valid for every purpose (as OpenSSL treats it).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CLIENT_AUTH",
    "SERVER_AUTH",
    "Bundle",
    "Issued",
    "SecretSpec",
    "default_secrets",
    "issue_bundle",
    "missing_purposes",
]

# The names cert-manager's `usages` and OpenSSL's messages use for the two EKUs.
SERVER_AUTH = "serverAuth"
CLIENT_AUTH = "clientAuth"
_OIDS = {SERVER_AUTH: ExtendedKeyUsageOID.SERVER_AUTH, CLIENT_AUTH: ExtendedKeyUsageOID.CLIENT_AUTH}
_PEM = serialization.Encoding.PEM


def missing_purposes(cert_pem: bytes, needed: Sequence[str]) -> list[str]:
    """The EKUs of `needed` that the first certificate in `cert_pem` does not allow.

    Raises ValueError when `cert_pem` holds no readable PEM certificate.
    """
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return []
    allowed = set(eku)
    if ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in allowed:
        return []
    return [name for name in needed if _OIDS[name] not in allowed]


@dataclass(frozen=True, slots=True)
class SecretSpec:
    """One Secret to make: its name, namespace, subject common name, SANs and EKUs."""

    name: str
    namespace: str
    common_name: str
    dns_names: tuple[str, ...]
    usages: tuple[str, ...]


def default_secrets(
    *, namespace: str, exporter_namespace: str, cluster_domain: str = "cluster.local"
) -> list[SecretSpec]:
    """The Secrets deploy/ mounts, plus the client certificate Prometheus scrapes with.

    The aggregator's names are every spelling a client in the cluster may dial (the leader
    Service and the metrics Service, short and fully qualified). The exporters all share one
    certificate (their node identity is the projected token) and run with hostNetwork, so
    Prometheus checks their certificate against the name `gputopo-exporter`
    (`serverName` in the shipped scrape settings); the scheduler likewise.
    """

    def names(service: str, ns: str) -> tuple[str, ...]:
        return (
            service,
            f"{service}.{ns}",
            f"{service}.{ns}.svc",
            f"{service}.{ns}.svc.{cluster_domain}",
        )

    both = (SERVER_AUTH, CLIENT_AUTH)
    return [
        SecretSpec(
            name="gputopo-aggregator-tls",
            namespace=namespace,
            common_name="gputopo-aggregator",
            dns_names=names("gputopo-aggregator", namespace)
            + names("gputopo-aggregator-metrics", namespace),
            usages=both,
        ),
        SecretSpec(
            name="gputopo-exporter-tls",
            namespace=exporter_namespace,
            common_name="gputopo-exporter",
            dns_names=names("gputopo-exporter", exporter_namespace),
            usages=both,
        ),
        SecretSpec(
            name="gputopo-scheduler-tls",
            namespace=namespace,
            common_name="gputopo-scheduler",
            dns_names=names("gputopo-scheduler", namespace),
            usages=both,
        ),
        *(
            SecretSpec(
                name="gputopo-prometheus-tls",
                namespace=ns,
                common_name="gputopo-prometheus",
                dns_names=(),
                usages=(CLIENT_AUTH,),
            )
            for ns in dict.fromkeys((namespace, exporter_namespace))
        ),
    ]


@dataclass(frozen=True, slots=True)
class Issued:
    """One Secret's files, PEM bytes."""

    spec: SecretSpec
    cert: bytes
    key: bytes
    ca: bytes


@dataclass(frozen=True, slots=True)
class Bundle:
    """A CA and what it signed."""

    ca_cert: bytes
    ca_key: bytes
    issued: tuple[Issued, ...]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue_bundle(
    specs: Sequence[SecretSpec],
    *,
    days: int,
    now: datetime.datetime,
    ca: tuple[bytes, bytes] | None = None,
    ca_name: str = "gputopo-ca",
) -> Bundle:
    """A CA (new, or `ca` = (cert PEM, key PEM) reused) and one leaf per spec, valid `days`.

    Keys are ECDSA P-256 (what cert-manager's `algorithm: ECDSA` gives, and fast to make).
    Leaves carry `digitalSignature` (all ECDHE needs), their EKUs, and their names as SANs.
    """
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days}")
    start = now - datetime.timedelta(minutes=5)  # a little slack for clocks a bit behind
    ca_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    if ca is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name(ca_name))
            .issuer_name(_name(ca_name))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(now + datetime.timedelta(days=max(days, 3650)))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
    else:
        ca_cert = x509.load_pem_x509_certificate(ca[0])
        loaded = serialization.load_pem_private_key(ca[1], password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError("the CA key must be an ECDSA or RSA key")
        ca_key = loaded
    ca_pem = ca_cert.public_bytes(_PEM)
    signer = ca_key
    issued = []
    for spec in specs:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(spec.common_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([_OIDS[u] for u in spec.usages]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
                critical=False,
            )
        )
        if spec.dns_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(n) for n in spec.dns_names]), critical=False
            )
        cert = builder.sign(signer, hashes.SHA256())
        issued.append(Issued(spec=spec, cert=cert.public_bytes(_PEM), key=_key_pem(key), ca=ca_pem))
    return Bundle(ca_cert=ca_pem, ca_key=_key_pem(signer), issued=tuple(issued))
