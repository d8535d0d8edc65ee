"""Throwaway TLS material for tests: a CA, a server certificate for 127.0.0.1/localhost and a
client certificate, all generated at test time with the `cryptography` package (test extra)."""
from __future__ import annotations

import datetime
import ipaddress
import pathlib
from dataclasses import dataclass


@dataclass
class Certs:
    ca: pathlib.Path
    server_cert: pathlib.Path
    server_key: pathlib.Path
    client_cert: pathlib.Path
    client_key: pathlib.Path
    other_ca: pathlib.Path      # a CA that signed nothing here: clients trusting it must fail
    token: pathlib.Path


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(k) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption())


def _cert(subject_cn, key, issuer_cn, issuer_key, ca: bool, san=None, usage=None):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    from cryptography.hazmat.primitives import serialization
    return b.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def make_certs(directory) -> Certs:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID
    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, other_key, srv_key, cli_key = _key(), _key(), _key(), _key()
    files = {
        "ca.pem": _cert("isthmus test CA", ca_key, "isthmus test CA", ca_key, True),
        "other-ca.pem": _cert("someone else's CA", other_key, "someone else's CA", other_key, True),
        "server.pem": _cert("localhost", srv_key, "isthmus test CA", ca_key, False,
                            san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                            usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
        "server.key": _pem_key(srv_key),
        "client.pem": _cert("isthmus test client", cli_key, "isthmus test CA", ca_key, False,
                            usage=[ExtendedKeyUsageOID.CLIENT_AUTH]),
        "client.key": _pem_key(cli_key),
        "token.txt": b"s3cret-test-token-0123456789\n",
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
                 d / "other-ca.pem", d / "token.txt")
