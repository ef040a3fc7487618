"""The authorizer: Kafka's ACL model over its ZooKeeper layout (AclAuthorizer).

An ACL binding is a resource pattern (resource type, name, pattern type) and an entry
(principal, host, operation, Allow/Deny). They live in ZooKeeper exactly as Kafka's
ZooKeeper authorizer kept them (``coordination.zk_layout``: ``/kafka-acl/<Type>/<name>``,
``/kafka-acl-extended/prefixed/<Type>/<name>``, change notifications under
``/kafka-acl-changes`` and ``/kafka-acl-extended-changes``), so Kafka's tools of that era
read them.

``Authorizer.authorize(principal, host, operation, resource_type, name)`` decides as
Kafka does:

- a principal in ``super.users`` may do everything;
- the entries that apply are those of every pattern matching the resource: the literal
  name, the literal wildcard ``*``, and every prefixed pattern the name starts with;
- none at all: ``allow.everyone.if.no.acl.found`` decides (false by default);
- a Deny entry for the principal (or ``User:*``), the host (or ``*``) and the operation
  (or ``All``) refuses, whatever allows;
- otherwise an Allow entry for the principal and host and the operation allows; Read,
  Write, Delete and Alter imply Describe, AlterConfigs implies DescribeConfigs, All
  implies everything.

Decisions are cached per (principal, host, operation, resource) until the ACLs change:
the broker asks on every request. ``AclWatcher`` keeps an Authorizer in step with
ZooKeeper: it loads every pattern at start and reloads the patterns a change notification
names (the whole set when a notification cannot be read), on its own thread, never on
kazoo's.

``AclAdmin`` writes: create and delete bindings with Kafka's filters (conditional znode
writes, retried on a lost race), list them. Its words are Kafka's (``Topic``, ``Read``,
``Allow``, ``LITERAL``); ``parse_*`` turn the public API's lower-case words into them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Iterable

from coordination import zk_layout as L
from coordination.errors import CoordinationError, VersionConflictError, ZkUnavailableError
from coordination.zk_layout import AclEntry

from ..errors import IllegalArgumentError, ZooKeeperUnavailableError

log = logging.getLogger(__name__)

WILDCARD = "*"
ANONYMOUS = "User:ANONYMOUS"
CLUSTER = L.CLUSTER_RESOURCE_NAME
WILDCARD_PRINCIPAL_TYPE_NAME = "*"
#: the operations an Allow of the key also grants (Kafka's implied operations)
_IMPLIED_BY = {
    "Describe": frozenset({"Describe", "Read", "Write", "Delete", "Alter", "All"}),
    "DescribeConfigs": frozenset({"DescribeConfigs", "AlterConfigs", "All"}),
}
_CACHE_LIMIT = 100_000


def principal_of(request) -> tuple[str, str]:
    """(principal, host) of a request's connection: ``User:ANONYMOUS`` until it has
    authenticated (the listener sets ``request.principal``)."""
    principal = getattr(request, "principal", None) or ANONYMOUS
    client = request.client
    host = client[0] if isinstance(client, tuple) and client else str(client or "")
    return principal, host


class Access:
    """The request handlers' view of the broker's authorizer (``authorizer()``: the
    Authorizer, or None when none is configured: then everything is allowed)."""

    def __init__(self, authorizer: Callable[[], "Authorizer | None"] = lambda: None):
        self._authorizer = authorizer

    @property
    def enabled(self) -> bool:
        return self._authorizer() is not None

    def allowed(self, request, operation: str, resource_type: str, name: str) -> bool:
        authorizer = self._authorizer()
        if authorizer is None:
            return True
        principal, host = principal_of(request)
        return authorizer.authorize(principal, host, operation, resource_type, name)

    def allowed_any(self, request, operation: str, resource_type: str) -> bool:
        authorizer = self._authorizer()
        if authorizer is None:
            return True
        principal, host = principal_of(request)
        return authorizer.authorize_any(principal, host, operation, resource_type)

    def denied(self, request, operation: str, resource_type: str, names) -> set[str]:
        """Those of ``names`` the request's principal may not ``operation``."""
        if self._authorizer() is None:
            return set()
        return {n for n in names if not self.allowed(request, operation, resource_type, n)}


@dataclass(frozen=True)
class AclBinding:
    """A resource pattern and one entry, in Kafka's words."""
    resource_type: str      # Topic, Group, Cluster, TransactionalId, DelegationToken, User
    name: str
    pattern_type: str       # LITERAL or PREFIXED
    principal: str
    host: str
    operation: str
    permission: str         # Allow or Deny

    @property
    def entry(self) -> AclEntry:
        return AclEntry(self.principal, self.host, self.operation, self.permission)

    def as_dict(self) -> dict:
        """The public API's form: Kafka's words in lower case."""
        return {"principal": self.principal, "host": self.host,
                "resource_type": self.resource_type.lower(), "resource_name": self.name,
                "pattern_type": self.pattern_type.lower(),
                "operation": _lower_word(self.operation),
                "permission": self.permission.lower()}


@dataclass(frozen=True)
class AclFilter:
    """Kafka's AclBindingFilter: None matches anything; ``pattern_type`` may also be ANY or
    MATCH (every pattern that applies to the resource ``name``)."""
    resource_type: str | None = None
    name: str | None = None
    pattern_type: str | None = None       # None/ANY, MATCH, LITERAL, PREFIXED
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None

    def matches_pattern(self, resource_type: str, name: str, pattern_type: str) -> bool:
        if self.resource_type not in (None, resource_type):
            return False
        if self.pattern_type == "MATCH":
            if self.name is None:
                return True
            return _applies(name, pattern_type, self.name)
        if self.pattern_type not in (None, "ANY", pattern_type):
            return False
        return self.name in (None, name)

    def matches_entry(self, e: AclEntry) -> bool:
        return (self.principal in (None, e.principal) and self.host in (None, e.host)
                and self.operation in (None, e.operation)
                and self.permission in (None, e.permission))


def _applies(pattern_name: str, pattern_type: str, name: str) -> bool:
    """Does the pattern (``pattern_name``, ``pattern_type``) cover the resource ``name``?"""
    if pattern_type == "LITERAL":
        return pattern_name == name or pattern_name == WILDCARD
    return name.startswith(pattern_name)


class Authorizer:
    """ACL decisions from an in-memory copy of the ACLs (see the module docstring)."""

    def __init__(self, *, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False):
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = bool(allow_everyone_if_no_acl_found)
        self._lock = threading.Lock()
        self._patterns: dict[tuple[str, str, str], frozenset[AclEntry]] = {}
        self._cache: dict[tuple, bool] = {}

    @classmethod
    def from_config(cls, config: dict) -> "Authorizer | None":
        """The broker's authorizer from Kafka's settings, None when none is configured:
        ``authorizer.class.name`` (any non-empty value turns on this ACL authorizer, e.g.
        Kafka's ``kafka.security.authorizer.AclAuthorizer``), ``super.users``
        (``User:a;User:b``), ``allow.everyone.if.no.acl.found`` (false)."""
        if not str(config.get("authorizer.class.name") or "").strip():
            return None
        supers = [p.strip() for p in str(config.get("super.users") or "").split(";")
                  if p.strip()]
        for p in supers:
            parse_principal(p)
        flag = str(config.get("allow.everyone.if.no.acl.found", "false")).strip().lower()
        if flag not in ("true", "false"):
            raise IllegalArgumentError(
                f"allow.everyone.if.no.acl.found must be true or false, got {flag!r}")
        return cls(super_users=supers, allow_everyone_if_no_acl_found=flag == "true")

    # -- the ACLs ----------------------------------------------------------------------
    def replace_all(self, patterns: dict[tuple[str, str, str], frozenset]) -> None:
        with self._lock:
            self._patterns = {k: frozenset(v) for k, v in patterns.items() if v}
            self._cache = {}

    def update(self, resource_type: str, name: str, pattern_type: str, entries) -> None:
        key = (resource_type, name, pattern_type)
        with self._lock:
            entries = frozenset(entries)
            if entries:
                self._patterns[key] = entries
            else:
                self._patterns.pop(key, None)
            self._cache = {}

    def bindings(self) -> list[AclBinding]:
        with self._lock:
            items = sorted(self._patterns.items())
        return [AclBinding(rt, name, pt, e.principal, e.host, e.operation, e.permission)
                for (rt, name, pt), entries in items
                for e in sorted(entries, key=_entry_order)]

    # -- decisions ---------------------------------------------------------------------
    def authorize(self, principal: str, host: str, operation: str, resource_type: str,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        key = (principal, host, operation, resource_type, name)
        decided = self._cache.get(key)
        if decided is not None:
            return decided
        with self._lock:
            entries = [e for (rt, pname, pt), es in self._patterns.items()
                       if rt == resource_type and _applies(pname, pt, name) for e in es]
            decided = self._decide(principal, host, operation, entries)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache = {}
            self._cache[key] = decided
        return decided

    def authorize_any(self, principal: str, host: str, operation: str,
                      resource_type: str) -> bool:
        """May the principal ``operation`` some resource of the type (Kafka's
        authorizeByResourceType, which InitProducerId uses: Write on any topic)? An
        Allow on any pattern of the type, unless a Deny covers every name (``*``)."""
        if principal in self.super_users:
            return True
        with self._lock:
            entries = [e for (rt, _, _), es in self._patterns.items()
                       if rt == resource_type for e in es]
            wildcard = [e for (rt, name, pt), es in self._patterns.items()
                        if rt == resource_type and pt == "LITERAL" and name == WILDCARD
                        for e in es]
        if not entries:
            return self.allow_everyone_if_no_acl_found
        kind = principal.partition(":")[0]
        principals = (principal, f"{kind}:{WILDCARD_PRINCIPAL_TYPE_NAME}")
        hosts = (host, WILDCARD)
        if any(e.permission == "Deny" and e.principal in principals and e.host in hosts
               and e.operation in (operation, "All") for e in wildcard):
            return False
        granting = _IMPLIED_BY.get(operation, frozenset({operation, "All"}))
        return any(e.permission == "Allow" and e.principal in principals and e.host in hosts
                   and e.operation in granting for e in entries) or \
            self.allow_everyone_if_no_acl_found

    def _decide(self, principal: str, host: str, operation: str, entries) -> bool:
        if not entries:
            return self.allow_everyone_if_no_acl_found
        kind = principal.partition(":")[0]
        principals = (principal, f"{kind}:{WILDCARD_PRINCIPAL_TYPE_NAME}")
        hosts = (host, WILDCARD)
        for e in entries:
            if (e.permission == "Deny" and e.principal in principals and e.host in hosts
                    and e.operation in (operation, "All")):
                return False
        granting = _IMPLIED_BY.get(operation, frozenset({operation, "All"}))
        return any(e.permission == "Allow" and e.principal in principals and e.host in hosts
                   and e.operation in granting for e in entries)


def _entry_order(e: AclEntry):
    return (e.principal, e.host, e.operation, e.permission)


def _lower_word(word: str) -> str:
    """ClusterAction -> cluster_action: the public API's spelling of Kafka's words."""
    out = []
    for i, ch in enumerate(word):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _parse(kind: str, value, words: Iterable[str], *, extra: Iterable[str] = ()) -> str:
    """Kafka's word for ``value`` in any case, with or without underscores."""
    if not isinstance(value, str):
        raise IllegalArgumentError(f"ACL {kind} must be a string, got {value!r}")
    wanted = value.replace("_", "").replace("-", "").lower()
    for word in (*words, *extra):
        if word.replace("_", "").lower() == wanted:
            return word
    raise IllegalArgumentError(
        f"unknown ACL {kind} {value!r}; one of "
        + ", ".join(_lower_word(w) if w.upper() != w else w.lower() for w in words))


def parse_resource_type(value) -> str:
    return _parse("resource type", value, L.ACL_RESOURCE_TYPES)


def parse_operation(value) -> str:
    return _parse("operation", value, L.ACL_OPERATIONS)


def parse_permission(value) -> str:
    return _parse("permission", value, L.ACL_PERMISSIONS)


def parse_pattern_type(value) -> str:
    return _parse("pattern type", value, L.ACL_PATTERN_TYPES)


def parse_principal(value) -> str:
    if not isinstance(value, str) or ":" not in value or value.startswith(":") \
            or value.endswith(":"):
        raise IllegalArgumentError(
            f"an ACL principal is TYPE:NAME, e.g. 'User:alice' or 'User:*', got {value!r}")
    return value


def binding(principal, resource_type, resource_name, operation, permission="allow",
            pattern_type="literal", host="*") -> AclBinding:
    """An AclBinding from the public API's words; IllegalArgumentError for a bad one
    (Kafka refuses a prefixed wildcard, a cluster resource not named kafka-cluster, and
    the ANY words in a binding)."""
    rt = parse_resource_type(resource_type)
    pt = parse_pattern_type(pattern_type)
    if not isinstance(resource_name, str) or not resource_name:
        raise IllegalArgumentError(f"an ACL resource name is a non-empty string, got "
                                        f"{resource_name!r}")
    if "/" in resource_name or resource_name in (".", ".."):
        raise IllegalArgumentError(f"ACL resource name {resource_name!r} cannot be "
                                        "stored (no '/', not '.' or '..')")
    if pt == "PREFIXED" and resource_name == WILDCARD:
        raise IllegalArgumentError("a prefixed ACL cannot be for '*' (use literal '*')")
    if rt == "Cluster" and resource_name != L.CLUSTER_RESOURCE_NAME:
        raise IllegalArgumentError(
            f"the cluster resource is named {L.CLUSTER_RESOURCE_NAME!r}, not {resource_name!r}")
    if not isinstance(host, str) or not host:
        raise IllegalArgumentError(f"an ACL host is '*' or an address, got {host!r}")
    return AclBinding(rt, resource_name, pt, parse_principal(principal), host,
                      parse_operation(operation), parse_permission(permission))


class AclAdmin:
    """Creates, deletes and lists ACL bindings in ZooKeeper (``coordination.store.ZkStore``)."""

    def __init__(self, store, *, attempts: int = 20):
        self.store = store
        self.attempts = attempts

    def _change(self, resource_type: str, name: str, pattern_type: str, edit) -> list:
        """Read a pattern's entries, ``edit(entries) -> (new entries, result)``, write them
        back conditionally; retried on a lost race. Returns the result."""
        for _ in range(self.attempts):
            try:
                entries, version = self.store.get_acls(resource_type, name, pattern_type)
                new, result = edit(entries)
                if new == entries:
                    return result
                self.store.set_acls(resource_type, name, pattern_type, new, version)
                return result
            except VersionConflictError:
                continue
            except ZkUnavailableError as exc:
                raise ZooKeeperUnavailableError(f"ACLs: ZooKeeper is unavailable: {exc}") \
                    from None
        raise ZooKeeperUnavailableError(
            f"ACLs of {resource_type}:{name}: {self.attempts} concurrent writers in a row")

    def create(self, bindings: Iterable[AclBinding]) -> None:
        by_pattern: dict[tuple, set] = {}
        for b in bindings:
            by_pattern.setdefault((b.resource_type, b.name, b.pattern_type), set()).add(b.entry)
        for (rt, name, pt), add in by_pattern.items():
            self._change(rt, name, pt, lambda entries, add=add: (entries | add, None))

    def delete(self, filters: Iterable[AclFilter]) -> list[list[AclBinding]]:
        """For each filter, the bindings it deleted."""
        filters = list(filters)
        deleted: list[list[AclBinding]] = [[] for _ in filters]
        try:
            patterns = self.store.acl_patterns()
        except CoordinationError as exc:
            raise ZooKeeperUnavailableError(f"ACLs: ZooKeeper is unavailable: {exc}") from None
        for rt, name, pt in patterns:
            wanted = [i for i, f in enumerate(filters) if f.matches_pattern(rt, name, pt)]
            if not wanted:
                continue

            def edit(entries, rt=rt, name=name, pt=pt, wanted=wanted):
                gone: list[tuple[int, AclEntry]] = []
                for e in entries:
                    for i in wanted:
                        if filters[i].matches_entry(e):
                            gone.append((i, e))
                return entries - {e for _, e in gone}, gone

            for i, e in self._change(rt, name, pt, edit):
                deleted[i].append(AclBinding(rt, name, pt, e.principal, e.host, e.operation,
                                             e.permission))
        return deleted

    def describe(self, flt: AclFilter = AclFilter()) -> list[AclBinding]:
        out = []
        try:
            for rt, name, pt in self.store.acl_patterns():
                if not flt.matches_pattern(rt, name, pt):
                    continue
                entries, _ = self.store.get_acls(rt, name, pt)
                out.extend(AclBinding(rt, name, pt, e.principal, e.host, e.operation,
                                      e.permission)
                           for e in sorted(entries, key=_entry_order) if flt.matches_entry(e))
        except CoordinationError as exc:
            raise ZooKeeperUnavailableError(f"ACLs: ZooKeeper is unavailable: {exc}") from None
        return out


class AclWatcher:
    """Keeps an Authorizer equal to the ACLs in ZooKeeper (see the module docstring)."""

    def __init__(self, store, authorizer: Authorizer, *, name: str = "acl-watcher"):
        self.store = store
        self.authorizer = authorizer
        self._seen: set[str] = set()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._loaded = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, *, timeout_s: float = 30.0) -> "AclWatcher":
        """Start and wait for the first full load (ZooKeeperUnavailableError after
        ``timeout_s``: a broker must not serve with an empty ACL set)."""
        self._thread.start()
        if not self._loaded.wait(timeout_s):
            raise ZooKeeperUnavailableError(
                f"the ACLs could not be loaded from ZooKeeper in {timeout_s:.0f} s")
        return self

    def close(self) -> None:
        self._stopped.set()
        self._wake.set()

    def _watch(self, _event) -> None:       # on kazoo's thread: only wake ours
        self._wake.set()

    def _run(self) -> None:
        full = True
        while not self._stopped.is_set():
            try:
                changes = self.store.acl_changes(watch=self._watch)
                if full:
                    self._load_all()
                    self._loaded.set()
                    full = False
                else:
                    self._apply([c for c in changes if c not in self._seen])
                self._seen = set(changes)
            except CoordinationError as exc:
                log.warning("ACL watcher: %s; reloading everything when ZooKeeper answers",
                            exc)
                full = True
                self._stopped.wait(1.0)
                continue
            self._wake.wait()
            self._wake.clear()

    def _load_all(self) -> None:
        patterns = {}
        for rt, name, pt in self.store.acl_patterns():
            patterns[(rt, name, pt)] = self.store.get_acls(rt, name, pt)[0]
        self.authorizer.replace_all(patterns)

    def _apply(self, paths: list[str]) -> None:
        for path in paths:
            pattern_type = "LITERAL" if path.startswith(L.ACL_CHANGES_PATH + "/") \
                else "PREFIXED"
            try:
                data, _ = self.store.zk.get(path)
                rt, name, pt = L.decode_acl_change(pattern_type, data)
            except Exception:                 # noqa: BLE001  gone or unreadable: reload all
                self._load_all()
                return
            self.authorizer.update(rt, name, pt, self.store.get_acls(rt, name, pt)[0])
