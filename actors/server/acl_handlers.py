"""The ACL APIs on the wire: DescribeAcls, CreateAcls, DeleteAcls (one handler each), over
the authorizer's ZooKeeper store (``authorizer.AclAdmin``).

Kafka's rules: without an authorizer every request answers SECURITY_DISABLED; DescribeAcls
needs Describe on the cluster, CreateAcls and DeleteAcls need Alter on it
(CLUSTER_AUTHORIZATION_FAILED otherwise); a binding or filter with an UNKNOWN word, a
binding with an ANY/MATCH word, or one Kafka refuses (a prefixed ``*``, a cluster resource
not named ``kafka-cluster``) answers INVALID_REQUEST for that entry only. The answers read
and write ZooKeeper (a few ms), so they run on the io threads, never inline.
"""

from __future__ import annotations

from typing import Any, Callable

from coordination import zk_layout as L

from .. import wire
from ..errors import IllegalArgumentError, KafkaError
from .authorizer import AclAdmin, AclBinding, AclFilter, Authorizer, binding, principal_of
from .network import Request

# Kafka's wire codes (ResourceType, PatternType, AclOperation, AclPermissionType)
_UNKNOWN, _ANY = 0, 1
RESOURCE_TYPES = {2: "Topic", 3: "Group", 4: "Cluster", 5: "TransactionalId",
                  6: "DelegationToken", 7: "User"}
PATTERN_TYPES = {3: "LITERAL", 4: "PREFIXED"}
_MATCH = 2
OPERATIONS = {2: "All", 3: "Read", 4: "Write", 5: "Create", 6: "Delete", 7: "Alter",
              8: "Describe", 9: "ClusterAction", 10: "DescribeConfigs", 11: "AlterConfigs",
              12: "IdempotentWrite", 13: "CreateTokens", 14: "DescribeTokens"}
PERMISSIONS = {2: "Deny", 3: "Allow"}
_CODES = {**{v: k for k, v in RESOURCE_TYPES.items()}, **{v: k for k, v in PATTERN_TYPES.items()},
          **{v: k for k, v in OPERATIONS.items()}, **{v: k for k, v in PERMISSIONS.items()}}


def _word(table: dict, code: int, what: str, *, any_ok: bool) -> str | None:
    if any_ok and code == _ANY:
        return None
    try:
        return table[code]
    except KeyError:
        raise IllegalArgumentError(f"{what} {code} is not valid here") from None


def filter_from_wire(f: dict, version: int) -> AclFilter:
    """An AclFilter from DescribeAcls' body or a DeleteAcls filter."""
    pattern = f.get("pattern_type_filter", 3)
    pattern_type = "MATCH" if pattern == _MATCH else _word(PATTERN_TYPES, pattern,
                                                             "pattern type", any_ok=True)
    return AclFilter(
        resource_type=_word(RESOURCE_TYPES, f["resource_type_filter"], "resource type",
                            any_ok=True),
        name=f["resource_name_filter"], pattern_type=pattern_type,
        principal=f["principal_filter"], host=f["host_filter"],
        operation=_word(OPERATIONS, f["operation"], "operation", any_ok=True),
        permission=_word(PERMISSIONS, f["permission_type"], "permission type", any_ok=True))


def binding_from_wire(c: dict) -> AclBinding:
    rt = _word(RESOURCE_TYPES, c["resource_type"], "resource type", any_ok=False)
    pt = _word(PATTERN_TYPES, c.get("resource_pattern_type", 3), "pattern type",
               any_ok=False)
    return binding(c["principal"], rt, c["resource_name"],
                   _word(OPERATIONS, c["operation"], "operation", any_ok=False),
                   _word(PERMISSIONS, c["permission_type"], "permission type",
                         any_ok=False), pt, c["host"])


def _binding_fields(b: AclBinding) -> dict:
    return {"resource_type": _CODES[b.resource_type], "resource_name": b.name,
            "pattern_type": _CODES[b.pattern_type], "principal": b.principal,
            "host": b.host, "operation": _CODES[b.operation],
            "permission_type": _CODES[b.permission]}


def _error(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, IllegalArgumentError):
        return wire.ERRORS_BY_NAME["INVALID_REQUEST"].code, str(exc)
    return wire.error_code(exc), str(exc) if isinstance(exc, KafkaError) else repr(exc)


class AclApis:
    """DescribeAcls, CreateAcls, DeleteAcls; ``authorizer()`` is the broker's Authorizer or
    None (no authorizer configured: SECURITY_DISABLED), ``admin()`` its AclAdmin."""

    def __init__(self, authorizer: Callable[[], Authorizer | None],
                 admin: Callable[[], AclAdmin | None]):
        self._authorizer = authorizer
        self._admin = admin

    def handlers(self) -> dict[int, Callable[[Request], Any]]:
        return {wire.DESCRIBE_ACLS: self.describe_acls, wire.CREATE_ACLS: self.create_acls,
                wire.DELETE_ACLS: self.delete_acls}

    @staticmethod
    def _body(request: Request) -> dict:
        return wire.decode_request_body(request.header, request.body, 0)

    def _refusal(self, request: Request, operation: str) -> tuple[int, str] | None:
        """The (error code, message) every entry gets when the request may not run."""
        authorizer = self._authorizer()
        if authorizer is None or self._admin() is None:
            return (wire.ERRORS_BY_NAME["SECURITY_DISABLED"].code,
                    "no authorizer is configured on this cluster (authorizer.class.name)")
        principal, host = principal_of(request)
        if not authorizer.authorize(principal, host, operation, "Cluster",
                                    L.CLUSTER_RESOURCE_NAME):
            return (wire.ERRORS_BY_NAME["CLUSTER_AUTHORIZATION_FAILED"].code,
                    f"{principal} may not {operation.lower()} the cluster's ACLs")
        return None

    def describe_acls(self, request: Request):
        body = self._body(request)
        refused = self._refusal(request, "Describe")
        out = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "resources": []}
        if refused is None:
            try:
                found = self._admin().describe(filter_from_wire(body, request.header.api_version))
            except Exception as exc:  # noqa: BLE001 - answered as its Kafka error
                refused = _error(exc)
        if refused is not None:
            out["error_code"], out["error_message"] = refused
            return wire.encode_response_parts(request.header, out)
        by_pattern: dict[tuple, list] = {}
        for b in found:
            by_pattern.setdefault((b.resource_type, b.name, b.pattern_type), []).append(b)
        for (rt, name, pt), bindings in by_pattern.items():
            out["resources"].append({
                "resource_type": _CODES[rt], "resource_name": name, "pattern_type": _CODES[pt],
                "acls": [{"principal": b.principal, "host": b.host,
                          "operation": _CODES[b.operation],
                          "permission_type": _CODES[b.permission]} for b in bindings]})
        return wire.encode_response_parts(request.header, out)

    def create_acls(self, request: Request):
        creations = self._body(request)["creations"]
        refused = self._refusal(request, "Alter")
        results = []
        if refused is not None:
            results = [refused] * len(creations)
        else:
            for c in creations:
                try:
                    self._admin().create([binding_from_wire(c)])
                    results.append((0, None))
                except Exception as exc:  # noqa: BLE001 - this creation's error
                    results.append(_error(exc))
        return wire.encode_response_parts(request.header, {
            "throttle_time_ms": 0,
            "results": [{"error_code": code, "error_message": msg} for code, msg in results]})

    def delete_acls(self, request: Request):
        filters = self._body(request)["filters"]
        refused = self._refusal(request, "Alter")
        answers: list[dict] = []
        for f in filters:
            answer = {"error_code": 0, "error_message": None, "matching_acls": []}
            if refused is not None:
                answer["error_code"], answer["error_message"] = refused
            else:
                try:
                    (gone,) = self._admin().delete([filter_from_wire(
                        f, request.header.api_version)])
                    answer["matching_acls"] = [{"error_code": 0, "error_message": None,
                                                **_binding_fields(b)} for b in gone]
                except Exception as exc:  # noqa: BLE001 - this filter's error
                    answer["error_code"], answer["error_message"] = _error(exc)
            answers.append(answer)
        return wire.encode_response_parts(request.header, {"throttle_time_ms": 0,
                                                           "filter_results": answers})
