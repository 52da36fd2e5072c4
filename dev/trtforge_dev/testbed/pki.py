"""Certificates and keys for the test bed: a CA, the apiserver's serving cert, an admin client cert,
the service-account signing key, and the front-proxy CA and client cert of API aggregation. Generated
once per state root, reused by later `up`s.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

_VALID_DAYS = 3650
FRONT_PROXY_CLIENT = "front-proxy-client"  # the name aggregated APIs allow (--requestheader-allowed-names)


@dataclass(frozen=True)
class PKI:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.dir / "front-proxy-ca.crt"

    @property
    def front_proxy_client_cert(self) -> Path:
        return self.dir / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.dir / "front-proxy-client.key"

    def complete(self) -> bool:
        files = (
            self.ca_cert,
            self.ca_key,
            self.serving_cert,
            self.serving_key,
            self.admin_cert,
            self.admin_key,
            self.sa_key,
            self.sa_pub,
        )
        return all(p.is_file() for p in files)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _sign(
    subject: x509.Name,
    pub: rsa.RSAPublicKey,
    ca_name: x509.Name,
    ca_key: rsa.RSAPrivateKey,
    *,
    ca: bool,
    usage: list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName],
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(pub)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def ensure_front_proxy(pki: PKI) -> None:
    """The front-proxy CA and the client certificate the apiserver's aggregator presents to aggregated
    APIs (``--proxy-client-cert-file``; its CA is ``--requestheader-client-ca-file``), unless both exist.
    A CA of its own, as Kubernetes wants: a certificate of the main CA would authenticate anyone as
    anyone through the request headers."""
    if pki.front_proxy_client_cert.exists() and pki.front_proxy_ca_cert.exists():
        return
    ca_key = _key()
    ca_name = _name("trtforge-testbed-front-proxy-ca")
    ca = _sign(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True, usage=[], sans=[])
    client_key = _key()
    client = _sign(
        _name(FRONT_PROXY_CLIENT),
        client_key.public_key(),
        ca_name,
        ca_key,
        ca=False,
        usage=[x509.ExtendedKeyUsageOID.CLIENT_AUTH],
        sans=[],
    )
    _write_key(pki.front_proxy_client_key, client_key)
    _write_cert(pki.front_proxy_client_cert, client)
    _write_cert(pki.front_proxy_ca_cert, ca)  # last: its presence says the pair is whole


def ensure_pki(directory: Path) -> PKI:
    """Create the CA, serving cert (127.0.0.1, localhost, kubernetes.default…), admin client cert
    (group system:masters) and service-account key pair unless all already exist."""
    pki = PKI(directory)
    if pki.complete():
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("trtforge-testbed-ca")
    ca = _sign(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True, usage=[], sans=[])
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca)

    srv_key = _key()
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        x509.DNSName("localhost"),
        *(
            x509.DNSName(n)
            for n in (
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            )
        ),
    ]
    srv = _sign(
        _name("kube-apiserver"),
        srv_key.public_key(),
        ca_name,
        ca_key,
        ca=False,
        usage=[x509.ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )
    _write_key(pki.serving_key, srv_key)
    _write_cert(pki.serving_cert, srv)

    adm_key = _key()
    adm = _sign(
        _name("trtforge-admin", "system:masters"),
        adm_key.public_key(),
        ca_name,
        ca_key,
        ca=False,
        usage=[x509.ExtendedKeyUsageOID.CLIENT_AUTH],
        sans=[],
    )
    _write_key(pki.admin_key, adm_key)
    _write_cert(pki.admin_cert, adm)

    sa_key = _key()
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki
