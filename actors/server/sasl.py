"""SASL on a broker's listener: one ``SaslAuthenticator`` per connection, answering its
SaslHandshake and SaslAuthenticate requests (Kafka's SaslServerAuthenticator), with the
mechanisms SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802 / RFC 7677, as Kafka's
ScramSaslServer) and PLAIN (RFC 4616, checked against the same SCRAM credentials).

The exchange, per connection: ApiVersions (optional, answered by KafkaApis), then
SaslHandshake (the mechanism; UNSUPPORTED_SASL_MECHANISM lists the enabled ones and the
connection closes), then SaslAuthenticate requests carrying the mechanism's tokens until
it completes (``AuthStep.principal`` set: ``User:<name>``) or fails
(SASL_AUTHENTICATION_FAILED, one message for an unknown user and a wrong password, as
Kafka's: a client cannot tell which). Anything out of order answers ILLEGAL_SASL_STATE and
closes. The network layer (network.py) decides what a connection may send before it is
authenticated, delays a failed answer and closes the connection after it.

Credentials come from a ``lookup(user, mechanism) -> ScramCredential | None`` (a broker's
``coordination.credentials.CredentialCache``): no ZooKeeper call here. SCRAM's server side
costs two HMACs and a hash (microseconds); PLAIN costs one PBKDF2 of the stored iteration
count (milliseconds), so the listener runs SASL requests on its io threads.

Not thread-safe: one connection's requests come one at a time (network.py's invariant).
Imports: actors.wire, coordination.credentials.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Callable

from coordination.credentials import SCRAM_MECHANISMS, check_password

from .. import wire
from .network import ANONYMOUS, AuthStep, Request

ALL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
_ERR = wire.ERRORS_BY_NAME


def _failed_message(mechanism: str) -> str:
    # Kafka's words (SaslServerAuthenticator), whatever the cause
    return (f"Authentication failed during authentication due to invalid credentials "
            f"with SASL mechanism {mechanism}")


class _BadExchange(Exception):
    """A token that breaks the mechanism's rules, or credentials that do not match."""


class _Scram:
    """RFC 5802's server side for one mechanism: two client messages, two answers."""

    def __init__(self, mechanism: str, lookup):
        self.mechanism = mechanism
        self.digest, _ = SCRAM_MECHANISMS[mechanism]
        self.lookup = lookup
        self.user: str | None = None
        self.step = 0

    def evaluate(self, token: bytes) -> tuple[bytes, str | None]:
        """(the answer, the authenticated user once done)."""
        if self.step == 0:
            self.step = 1
            return self._first(token), None
        if self.step == 1:
            self.step = 2
            return self._final(token), self.user
        raise _BadExchange("the SCRAM exchange is already complete")

    def _first(self, token: bytes) -> bytes:
        text = _text(token)
        gs2, sep, bare = _split_gs2(text)
        if not sep:
            raise _BadExchange("client-first-message without a GS2 header")
        attrs = _attributes(bare)
        user, nonce = attrs.get("n"), attrs.get("r")
        if not user or not nonce:
            raise _BadExchange("client-first-message lacks n= or r=")
        user = user.replace("=2C", ",").replace("=3D", "=")
        authzid = gs2.split(",")[1]
        if authzid and authzid[2:] != user:
            raise _BadExchange("authorization id differs from the user name")
        credential = self.lookup(user, self.mechanism)
        if credential is None:
            raise _BadExchange(f"unknown user {user!r}")
        self.user, self.credential = user, credential
        self.gs2 = gs2 + ","
        self.nonce = nonce + base64.b64encode(os.urandom(18)).decode()
        self.client_first_bare = bare
        self.server_first = (f"r={self.nonce},s={base64.b64encode(credential.salt).decode()},"
                             f"i={credential.iterations}")
        return self.server_first.encode()

    def _final(self, token: bytes) -> bytes:
        text = _text(token)
        without_proof, sep, proof = text.rpartition(",p=")
        if not sep:
            raise _BadExchange("client-final-message without a proof")
        attrs = _attributes(without_proof)
        try:
            channel = base64.b64decode(attrs.get("c", ""), validate=True).decode()
            proof_bytes = base64.b64decode(proof, validate=True)
        except ValueError:
            raise _BadExchange("client-final-message: bad base64") from None
        # Kafka's ScramSaslServer accepts a final nonce that *ends with* the server's (not
        # RFC 5802's equality): librdkafka before 2.x's fix (Debian's kcat, librdkafka
        # 2.0.2) sends the client nonce twice; the proof still covers what was sent
        if channel != self.gs2 or not attrs.get("r", "").endswith(self.nonce):
            raise _BadExchange("channel binding or nonce differs from the first message")
        auth_message = ",".join((self.client_first_bare, self.server_first,
                                 without_proof)).encode()
        stored = self.credential.stored_key
        signature = hmac.new(stored, auth_message, self.digest).digest()
        if len(proof_bytes) != len(signature):
            raise _BadExchange("proof of the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof_bytes, signature))
        if not hmac.compare_digest(hashlib.new(self.digest, client_key).digest(), stored):
            raise _BadExchange(f"wrong password for {self.user!r}")
        server_signature = hmac.new(self.credential.server_key, auth_message,
                                    self.digest).digest()
        return b"v=" + base64.b64encode(server_signature)


class _Plain:
    """RFC 4616: one message ``authzid NUL user NUL password``, checked against the
    user's SCRAM credential (SHA-256's when both exist)."""

    mechanism = "PLAIN"

    def __init__(self, lookup_all):
        self.lookup_all = lookup_all
        self.done = False

    def evaluate(self, token: bytes) -> tuple[bytes, str | None]:
        if self.done:
            raise _BadExchange("the PLAIN exchange is already complete")
        self.done = True
        parts = _text(token).split("\0")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            raise _BadExchange("a PLAIN message is authzid NUL user NUL password")
        authzid, user, password = parts
        if authzid and authzid != user:
            raise _BadExchange("authorization id differs from the user name")
        credentials = self.lookup_all(user)
        for mechanism in SCRAM_MECHANISMS:
            if mechanism in credentials:
                if check_password(mechanism, credentials[mechanism], password):
                    return b"", user
                break
        raise _BadExchange(f"unknown user or wrong password for {user!r}")


def _text(token) -> str:
    try:
        return bytes(token).decode("utf-8")
    except UnicodeDecodeError:
        raise _BadExchange("a token that is not UTF-8") from None


def _split_gs2(text: str) -> tuple[str, bool, str]:
    """("n,a=authzid" or "n,", found, the rest) of a client-first-message."""
    first, sep1, rest = text.partition(",")
    authz, sep2, bare = rest.partition(",")
    if not (sep1 and sep2) or first not in ("n", "y"):
        return "", False, ""
    return f"{first},{authz}", True, bare


def _attributes(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or len(key) != 1:
            raise _BadExchange(f"malformed SCRAM attribute {item!r}")
        out.setdefault(key, value)
    return out


class SaslAuthenticator:
    """One connection's SASL state: ``handle(request) -> AuthStep`` for its SaslHandshake
    and SaslAuthenticate requests (see the module docstring)."""

    def __init__(self, mechanisms: tuple[str, ...],
                 lookup: Callable[[str, str], object],
                 lookup_all: Callable[[str], dict]):
        self.mechanisms = tuple(mechanisms)
        self._lookup, self._lookup_all = lookup, lookup_all
        self._server = None
        self.mechanism: str | None = None

    def handle(self, request: Request) -> AuthStep:
        header = request.header
        body = wire.decode_request_body(header, request.body, 0)
        if header.api_key == wire.SASL_HANDSHAKE:
            return self._handshake(header, body["mechanism"])
        if header.api_key == wire.SASL_AUTHENTICATE:
            return self._authenticate(header, body["auth_bytes"])
        raise wire.InvalidRequestError(f"API key {header.api_key} is not SASL", header)

    def _handshake(self, header, mechanism: str) -> AuthStep:
        answer = {"mechanisms": list(self.mechanisms)}
        if self._server is not None:
            return AuthStep(wire.encode_response_parts(header, {
                **answer, "error_code": _ERR["ILLEGAL_SASL_STATE"].code}),
                failed="a second SaslHandshake")
        if mechanism not in self.mechanisms:
            return AuthStep(wire.encode_response_parts(header, {
                **answer, "error_code": _ERR["UNSUPPORTED_SASL_MECHANISM"].code}),
                failed=f"unsupported SASL mechanism {mechanism!r}")
        self.mechanism = mechanism
        self._server = (_Plain(self._lookup_all) if mechanism == "PLAIN"
                        else _Scram(mechanism, self._lookup))
        return AuthStep(wire.encode_response_parts(header, {**answer,
                                                            "error_code": wire.NONE}))

    def _authenticate(self, header, token) -> AuthStep:
        if self._server is None:
            return AuthStep(self._auth_answer(header, "ILLEGAL_SASL_STATE",
                                              "SaslAuthenticate before SaslHandshake"),
                            failed="SaslAuthenticate before SaslHandshake")
        try:
            answer, user = self._server.evaluate(token)
        except _BadExchange as exc:
            message = _failed_message(self.mechanism)
            return AuthStep(self._auth_answer(header, "SASL_AUTHENTICATION_FAILED", message),
                            failed=f"{message}: {exc}", delay=True)
        return AuthStep(wire.encode_response_parts(header, {
            "error_code": wire.NONE, "error_message": None, "auth_bytes": answer,
            "session_lifetime_ms": 0}), principal=f"User:{user}" if user else None)

    @staticmethod
    def _auth_answer(header, error: str, message: str) -> list:
        return wire.encode_response_parts(header, {
            "error_code": _ERR[error].code, "error_message": message, "auth_bytes": b"",
            "session_lifetime_ms": 0})


__all__ = ["SaslAuthenticator", "AuthStep", "ANONYMOUS", "ALL_MECHANISMS"]
