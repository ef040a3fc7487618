"""Test PKI for the security tests: a CA and a broker certificate made in the test's
temporary directory (never committed keys), with actors/server/pki.py, the module
``Cluster.start(secure=True)`` makes its own with."""

from __future__ import annotations

import os

from actors.server import pki


def make_pki(directory: str, hosts=("localhost", "127.0.0.1")) -> dict:
    """A CA and a server certificate for ``hosts`` (EC P-256, one day): paths of
    ``ca`` (PEM certificate), ``cert`` and ``key`` (the server's)."""
    ca, ca_key = pki.make_ca("raykafka test CA", days=1)
    cert, key = pki.make_certificate(ca, ca_key, hosts, days=1, common_name="broker")
    out = {"ca": os.path.join(directory, "ca.pem"), "cert": os.path.join(directory, "broker.pem"),
           "key": os.path.join(directory, "broker.key")}
    pki.write_public(out["ca"], ca)
    pki.write_public(out["cert"], cert)
    pki.write_private(out["key"], key)
    return out
