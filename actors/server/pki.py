"""The certificates of a secured cluster (``Cluster.start(secure=True)``): a CA of the
cluster's own and a broker certificate it signs, EC P-256, PEM, made with ``cryptography``.

- ``make_ca(common_name, days)`` -> (certificate PEM, key PEM): a self-signed CA
  (basicConstraints CA:true, keyCertSign), ``CA_DAYS`` (10 years) by default.
- ``make_certificate(ca_pem, ca_key_pem, hosts, days, common_name)`` -> (certificate PEM,
  key PEM): a leaf for ``hosts`` (DNS names and IP addresses as subjectAltNames), for both
  server and client authentication (a broker is also a client of the others: its fetchers),
  ``CERT_DAYS`` (1 year) by default.
- ``needs_new_certificate(cert_pem, ca_pem, hosts, renew_days)``: whether a certificate on
  disk can be kept (signed by that CA, names every host, valid for at least ``renew_days``
  more) or must be made again.
- ``write_private(path, data)``: a file only its owner may read (0600), written whole.

Every broker of a cluster shares one certificate (its names cover every node known at
start): a cluster's CA is the trust anchor clients need, the broker certificate is an
implementation detail renewed from the same CA (docs/security.md, "Rotating").
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import tempfile

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
CERT_DAYS = 365
RENEW_DAYS = 30
_BACKDATE = datetime.timedelta(minutes=5)     # tolerate clocks a little behind ours


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _general_names(hosts) -> list:
    out, seen = [], set()
    for host in hosts:
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def make_ca(common_name: str = "raykafka CA", days: int = CA_DAYS) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, private key PEM)."""
    now = _now()
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(common_name))
            .issuer_name(_name(common_name)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return _cert_pem(cert), _key_pem(key)


def make_certificate(ca_pem: bytes, ca_key_pem: bytes, hosts, *, days: int = CERT_DAYS,
                     common_name: str = "raykafka broker") -> tuple[bytes, bytes]:
    """A certificate for ``hosts`` signed by the CA: (certificate PEM, private key PEM)."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    names = _general_names(hosts)
    if not names:
        raise ValueError("a certificate needs at least one host name or address")
    now = _now()
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + datetime.timedelta(days=days), ca.not_valid_after_utc)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _cert_pem(cert), _key_pem(key)


def certificate_hosts(cert_pem: bytes) -> set[str]:
    """The DNS names and IP addresses (as text) a certificate names."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | \
        {str(a) for a in san.get_values_for_type(x509.IPAddress)}


def needs_new_certificate(cert_pem: bytes, ca_pem: bytes, hosts, *,
                          renew_days: int = RENEW_DAYS) -> str | None:
    """Why ``cert_pem`` cannot be kept (not signed by the CA, a host it does not name, it
    expires within ``renew_days``), or None when it can."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    if cert.issuer != ca.subject:
        return "it was not issued by this CA"
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError) as exc:
        return f"its signature does not verify with this CA ({type(exc).__name__})"
    missing = {str(ipaddress.ip_address(h)) if _is_ip(h) else h for h in hosts if h} \
        - certificate_hosts(cert_pem)
    if missing:
        return f"it does not name {', '.join(sorted(missing))}"
    if cert.not_valid_after_utc - _now() < datetime.timedelta(days=renew_days):
        return f"it expires on {cert.not_valid_after_utc:%Y-%m-%d}"
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def expires(cert_pem: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def _write(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` whole (a new temporary file of ``mode`` beside it, made
    with O_EXCL by mkstemp, renamed into place: never through a name someone prepared)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.",
                               dir=os.path.dirname(path) or ".")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_private(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only (0600 from the start)."""
    _write(path, data, 0o600)


def write_public(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (0644: certificates are not secrets)."""
    _write(path, data, 0o644)


__all__ = ["make_ca", "make_certificate", "needs_new_certificate", "certificate_hosts",
           "expires", "write_private", "write_public", "CA_DAYS", "CERT_DAYS", "RENEW_DAYS"]
