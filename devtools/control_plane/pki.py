"""Certificates and keys for a local control plane, generated with `cryptography`.

Two CAs as envtest does: one signs the apiserver's serving certificate, the other the client
certificates (admin in system:masters, and the controller manager's identity). Plus the key
pair that signs and verifies service-account tokens.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devtools.control_plane.node import NODE_NAME

VALIDITY = timedelta(days=30)
SERVING_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
SERVING_IPS = ("127.0.0.1", "10.0.0.1")

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class Issued:
    certificate: x509.Certificate
    key: PrivateKey

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: PrivateKey, not_after: datetime | None = None
) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    ends = not_after or now + VALIDITY
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(min(now - timedelta(minutes=5), ends - timedelta(minutes=5)))
        .not_valid_after(ends)
    )


def certificate_authority(common_name: str) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    certificate = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Issued(certificate, key)


def _leaf(
    ca: Issued,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    names: x509.SubjectAlternativeName | None = None,
    not_after: datetime | None = None,
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(subject, ca.certificate.subject, key, not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if names is not None:
        builder = builder.add_extension(names, critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def serving_certificate(
    ca: Issued,
    common_name: str = "kube-apiserver",
    *,
    dns_names: tuple[str, ...] = SERVING_NAMES,
    ips: tuple[str, ...] = SERVING_IPS,
    not_after: datetime | None = None,
) -> Issued:
    """For the loopback names and addresses by default; tests give others (a name mismatch) or
    an end in the past (an expired certificate)."""
    names = x509.SubjectAlternativeName(
        [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    )
    return _leaf(ca, _name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, names, not_after)


def client_certificate(ca: Issued, user: str, group: str | None = None) -> Issued:
    return _leaf(ca, _name(user, group), ExtendedKeyUsageOID.CLIENT_AUTH)


def write_pki(directory: Path) -> dict[str, Issued]:
    """Generate everything a local control plane needs and write it as PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    serving_ca = certificate_authority("undolog-local-serving-ca")
    client_ca = certificate_authority("undolog-local-client-ca")
    issued = {
        "serving-ca": serving_ca,
        "client-ca": client_ca,
        "apiserver": serving_certificate(serving_ca),
        "admin": client_certificate(client_ca, "undolog-admin", "system:masters"),
        # Without service-account credentials (no token controller here) the controller manager
        # acts as itself; its garbage collector must delete any owned object, custom ones included.
        "controller-manager": client_certificate(client_ca, "system:kube-controller-manager", "system:masters"),
        # A node's parts (used when the control plane runs with one): the apiserver calling
        # kubelets (logs, exec), the kubelet, and the users RBAC's bootstrap roles are bound to.
        "apiserver-kubelet-client": client_certificate(client_ca, "kube-apiserver-kubelet-client", "system:masters"),
        "node": client_certificate(client_ca, f"system:node:{NODE_NAME}", "system:nodes"),
        "scheduler": client_certificate(client_ca, "system:kube-scheduler"),
        "proxy": client_certificate(client_ca, "system:kube-proxy"),
    }
    for name, item in issued.items():
        _write(directory / f"{name}.crt", item.certificate_pem)
        _write(directory / f"{name}.key", item.key_pem)
    service_account = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(
        directory / "service-account.key",
        service_account.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    _write(
        directory / "service-account.pub",
        service_account.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return issued


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)
