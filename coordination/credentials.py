"""SCRAM credentials in ZooKeeper, stored as Kafka stores them, and a broker's cache of them.

Layout (Kafka's, ZooKeeper mode):

- ``/config/users/<user>``: ``{"version":1,"config":{"SCRAM-SHA-256":"salt=<b64>,
  stored_key=<b64>,server_key=<b64>,iterations=4096", "SCRAM-SHA-512": ...}}``, one
  entry per mechanism the user has a credential for. The password itself is never stored:
  ``SaltedPassword = PBKDF2(HMAC-H, password, salt, iterations)``, ``ClientKey =
  HMAC(SaltedPassword, "Client Key")``, ``StoredKey = H(ClientKey)``, ``ServerKey =
  HMAC(SaltedPassword, "Server Key")`` (RFC 5802 section 3).
- ``/config/changes/config_change_<seq>``: ``{"version":2,"entity_path":"users/<user>"}``
  after every change, so a broker that watches the sequence re-reads that user.

``CredentialStore(zk)`` writes and reads them; ``CredentialCache(zk)`` is a broker's view:
loaded once, then refreshed per user on each change notification (a kazoo child watch that
only sets an event; one thread re-reads). Lookups (``get``) never touch ZooKeeper, so the
network thread may authenticate with it.

Not guaranteed: a change reaches a broker after the notification's watch fires, so a
deleted user can authenticate for a moment after ``delete_user`` returns (as in Kafka); a
connection that authenticated stays open (no re-authentication, KIP-368, yet).

Thread-safe. Imports nothing of ``actors``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import re
import threading
from dataclasses import dataclass

from kazoo.exceptions import NodeExistsError, NoNodeError

from coordination import zk_layout as L
from coordination.errors import CoordinationError, ZkDataError
from coordination.retry import DEFAULT_RETRY, RetryPolicy
from coordination.session import ZkClient

log = logging.getLogger(__name__)

USERS_PATH = "/config/users"
#: SCRAM mechanism -> (hashlib name, digest size): Kafka's ScramMechanism.
SCRAM_MECHANISMS = {"SCRAM-SHA-256": ("sha256", 32), "SCRAM-SHA-512": ("sha512", 64)}
#: Kafka's minimum (and kafka-configs' default) iteration count.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
_USER_RE = re.compile(r"^[^/\x00,=\s]{1,255}$")


def user_path(user: str) -> str:
    if not _USER_RE.match(user or "") or user in (".", ".."):
        raise ValueError(f"invalid user name {user!r}: 1-255 characters, none of "
                         f"'/', ',', '=', NUL or white space")
    return f"{USERS_PATH}/{user}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class ScramCredential:
    """One user's credential for one SCRAM mechanism (Kafka's ScramCredential)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_string(self) -> str:
        return (f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
                f"server_key={_b64(self.server_key)},iterations={self.iterations}")

    @classmethod
    def from_string(cls, text: str) -> "ScramCredential":
        try:
            fields = dict(part.split("=", 1) for part in text.split(","))
            return cls(base64.b64decode(fields["salt"], validate=True),
                       base64.b64decode(fields["stored_key"], validate=True),
                       base64.b64decode(fields["server_key"], validate=True),
                       int(fields["iterations"]))
        except (KeyError, ValueError) as exc:
            raise ZkDataError(f"unreadable SCRAM credential: {exc!r}") from None


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's Hi(): PBKDF2 with HMAC-H."""
    digest, _ = SCRAM_MECHANISMS[mechanism]
    return hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations)


def keys_of(mechanism: str, salted: bytes) -> tuple[bytes, bytes, bytes]:
    """(client key, stored key, server key) of a salted password."""
    digest, _ = SCRAM_MECHANISMS[mechanism]
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    return client_key, hashlib.new(digest, client_key).digest(), server_key


def scram_credential(mechanism: str, password: str, *, iterations: int = MIN_ITERATIONS,
                     salt: bytes | None = None) -> ScramCredential:
    """A new credential for ``password`` (a random 32-byte salt unless given)."""
    if mechanism not in SCRAM_MECHANISMS:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}; known: "
                         f"{', '.join(SCRAM_MECHANISMS)}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, "
                         f"got {iterations}")
    if not password:
        raise ValueError("the password is empty")
    salt = os.urandom(32) if salt is None else salt
    _, stored, server = keys_of(mechanism, salted_password(mechanism, password, salt,
                                                          iterations))
    return ScramCredential(salt, stored, server, iterations)


def check_password(mechanism: str, credential: ScramCredential, password: str) -> bool:
    """Does ``password`` match the stored credential? (SASL/PLAIN checks against SCRAM
    credentials: one PBKDF2, milliseconds of CPU.)"""
    _, stored, _ = keys_of(mechanism, salted_password(mechanism, password, credential.salt,
                                                      credential.iterations))
    return hmac.compare_digest(stored, credential.stored_key)


def encode_user(credentials: dict[str, ScramCredential]) -> bytes:
    return json.dumps({"version": 1, "config": {m: c.to_string() for m, c in
                                                sorted(credentials.items())}},
                      separators=(",", ":")).encode()


def decode_user(user: str, data: bytes | None) -> dict[str, ScramCredential]:
    try:
        config = json.loads(data or b"{}").get("config") or {}
    except (ValueError, AttributeError) as exc:
        raise ZkDataError(f"{USERS_PATH}/{user}: not JSON: {exc}") from None
    return {m: ScramCredential.from_string(v) for m, v in config.items()
            if m in SCRAM_MECHANISMS}


def encode_user_change(user: str) -> bytes:
    return json.dumps({"version": 2, "entity_path": f"users/{user}"}).encode()


class CredentialStore:
    """``/config/users`` read and written (see the module docstring)."""

    def __init__(self, zk: ZkClient, *, retry: RetryPolicy = DEFAULT_RETRY):
        self.zk = zk
        self.retry = retry

    def users(self) -> list[str]:
        try:
            return sorted(self.retry.run(lambda: self.zk.get_children(USERS_PATH)))
        except NoNodeError:
            return []

    def get(self, user: str) -> dict[str, ScramCredential]:
        """The user's credentials by mechanism ({} for an unknown user)."""
        path = user_path(user)
        try:
            data, _ = self.retry.run(lambda: self.zk.get(path))
        except NoNodeError:
            return {}
        return decode_user(user, data)

    def set(self, user: str, credentials: dict[str, ScramCredential], *,
            create_only: bool = False) -> bool:
        """Store ``credentials`` (replacing the mechanisms given, keeping the others) and
        post a change notification. ``create_only``: leave an existing user alone
        (False returned)."""
        path = user_path(user)

        def write() -> bool:
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                try:
                    self.zk.create(path, encode_user(credentials), makepath=True)
                    return True
                except NodeExistsError:
                    if create_only:
                        return False
                    data, stat = self.zk.get(path)
            if create_only:
                return False
            merged = {**decode_user(user, data), **credentials}
            self.zk.set(path, encode_user(merged), version=stat.version)
            return True
        changed = self.retry.run(write)
        if changed:
            self._notify(user)
        return changed

    def delete(self, user: str) -> bool:
        """Remove the user (all mechanisms); False when there was none."""
        path = user_path(user)
        try:
            self.retry.run(lambda: self.zk.delete(path))
        except NoNodeError:
            return False
        self._notify(user)
        return True

    def _notify(self, user: str) -> None:
        self.retry.run(lambda: self.zk.create(
            f"{L.CONFIG_CHANGES_PATH}/{L.CONFIG_CHANGE_PREFIX}", encode_user_change(user),
            sequence=True, makepath=True))


class CredentialCache:
    """A broker's copy of every user's credentials, refreshed by change notifications.

    ``start()`` loads all users and watches ``/config/changes``; each new notification
    for ``users/<name>`` re-reads that user (a notification it cannot read makes it
    reload everyone). ``get(user, mechanism)`` answers from memory."""

    def __init__(self, zk: ZkClient, *, poll_s: float = 30.0):
        self.store = CredentialStore(zk)
        self.zk = zk
        self._poll_s = poll_s               # a full reload this often, in case a watch is lost
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._seen: set[str] = set()        # notification names already applied
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.loads = 0                      # full reloads done (tests, stats)

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    def mechanisms(self, user: str) -> dict[str, ScramCredential]:
        return dict(self._users.get(user, {}))

    def start(self) -> "CredentialCache":
        self._reload_all()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="credential-cache")
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._wake.set()

    def _on_watch(self, *_):
        self._wake.set()                    # flags only: the loop re-reads

    def _reload_all(self) -> None:
        users = {}
        for user in self.store.users():
            try:
                users[user] = self.store.get(user)
            except ZkDataError as exc:
                log.warning("credentials of %r unreadable: %s", user, exc)
        self._users = users
        self.loads += 1
        self._changes()

    def _changes(self) -> list[str]:
        try:
            names = self.zk.get_children(L.CONFIG_CHANGES_PATH, watch=self._on_watch)
        except NoNodeError:
            self.zk.ensure_path(L.CONFIG_CHANGES_PATH)
            names = self.zk.get_children(L.CONFIG_CHANGES_PATH, watch=self._on_watch)
        new = sorted(set(names) - self._seen)
        self._seen = set(names)
        return new

    def _apply(self, names: list[str]) -> None:
        for name in names:
            try:
                data, _ = self.zk.get(f"{L.CONFIG_CHANGES_PATH}/{name}")
                entity = json.loads(data).get("entity_path", "")
            except NoNodeError:
                continue                    # purged already: it was older than our load
            except ValueError:
                self._reload_all()
                return
            kind, _, user = str(entity).partition("/")
            if kind != "users" or not user:
                continue
            creds = self.store.get(user)
            users = dict(self._users)
            if creds:
                users[user] = creds
            else:
                users.pop(user, None)
            self._users = users             # replaced, never mutated: readers take no lock

    def _loop(self) -> None:
        while not self._closed.is_set():
            woken = self._wake.wait(self._poll_s)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                if woken:
                    self._apply(self._changes())
                else:
                    self._reload_all()
            except (CoordinationError, NoNodeError) as exc:
                log.info("credential cache: %s; retrying", exc)
                self._closed.wait(1.0)
                self._wake.set()
            except Exception:  # noqa: BLE001 - the loop must live on
                log.exception("credential cache loop failed; retrying")
                self._closed.wait(1.0)
                self._wake.set()


__all__ = ["ScramCredential", "CredentialStore", "CredentialCache", "SCRAM_MECHANISMS",
           "scram_credential", "check_password", "salted_password", "keys_of", "user_path",
           "USERS_PATH", "MIN_ITERATIONS"]
