"""ACLs: the authorizer's decisions (Kafka's rules), the public API's words, and the
ZooKeeper layout Kafka's ZooKeeper authorizer used, against a real ZooKeeper."""

import itertools
import json

import pytest

from actors.errors import IllegalArgumentError
from actors.server.authorizer import (AclAdmin, AclBinding, AclFilter, AclWatcher,
                                      Authorizer, binding)
from coordination import zk_layout as L
from coordination.session import ZkSettings, connect
from coordination.store import ZkStore
from coordination.zk_layout import AclEntry
from zk_helpers import plain_client, start_zookeeper, wait_until

ALICE, BOB = "User:alice", "User:bob"


def allow(principal, operation, host="*"):
    return AclEntry(principal, host, operation, "Allow")


def deny(principal, operation, host="*"):
    return AclEntry(principal, host, operation, "Deny")


# -- decisions (no ZooKeeper) ---------------------------------------------------------------

def test_no_acl_for_a_resource_denies_unless_allow_everyone_if_no_acl_found():
    """A resource without any ACL: refused by default, allowed with
    allow.everyone.if.no.acl.found; one ACL for someone else makes it refused again."""
    strict, lax = Authorizer(), Authorizer(allow_everyone_if_no_acl_found=True)
    assert not strict.authorize(ALICE, "1.2.3.4", "Read", "Topic", "t")
    assert lax.authorize(ALICE, "1.2.3.4", "Read", "Topic", "t")
    lax.update("Topic", "t", "LITERAL", {allow(BOB, "Read")})
    assert not lax.authorize(ALICE, "1.2.3.4", "Read", "Topic", "t")
    assert lax.authorize(BOB, "1.2.3.4", "Read", "Topic", "t")


def test_super_users_may_do_everything():
    """A super user is allowed even against a Deny."""
    auth = Authorizer(super_users=["User:admin"])
    auth.update("Topic", "t", "LITERAL", {deny("User:admin", "All")})
    assert auth.authorize("User:admin", "h", "Write", "Topic", "t")


def test_deny_wins_over_allow_and_matches_wildcard_principal_and_host():
    """A Deny for User:* or for the host refuses what an Allow grants."""
    auth = Authorizer()
    auth.update("Topic", "t", "LITERAL", {allow(ALICE, "All"), deny("User:*", "Write")})
    assert auth.authorize(ALICE, "h", "Read", "Topic", "t")
    assert not auth.authorize(ALICE, "h", "Write", "Topic", "t")
    auth.update("Topic", "u", "LITERAL", {allow(ALICE, "Read"), deny(ALICE, "Read", "10.0.0.9")})
    assert auth.authorize(ALICE, "10.0.0.1", "Read", "Topic", "u")
    assert not auth.authorize(ALICE, "10.0.0.9", "Read", "Topic", "u")


def test_implied_operations_are_kafkas():
    """Read/Write/Delete/Alter imply Describe, AlterConfigs implies DescribeConfigs, All
    implies everything; nothing implies Write."""
    auth = Authorizer()
    auth.update("Topic", "r", "LITERAL", {allow(ALICE, "Read")})
    auth.update("Topic", "c", "LITERAL", {allow(ALICE, "AlterConfigs")})
    auth.update("Topic", "a", "LITERAL", {allow(ALICE, "All")})
    assert auth.authorize(ALICE, "h", "Describe", "Topic", "r")
    assert not auth.authorize(ALICE, "h", "Write", "Topic", "r")
    assert auth.authorize(ALICE, "h", "DescribeConfigs", "Topic", "c")
    assert not auth.authorize(ALICE, "h", "Describe", "Topic", "c")
    assert auth.authorize(ALICE, "h", "Create", "Topic", "a")


def test_literal_wildcard_and_prefixed_patterns_apply_to_matching_names_only():
    """Literal '*' covers every name of its type; a prefixed pattern covers the names that
    start with it; neither covers another resource type."""
    auth = Authorizer()
    auth.update("Topic", "*", "LITERAL", {allow(ALICE, "Describe")})
    auth.update("Topic", "orders.", "PREFIXED", {allow(BOB, "Write")})
    assert auth.authorize(ALICE, "h", "Describe", "Topic", "anything")
    assert auth.authorize(BOB, "h", "Write", "Topic", "orders.eu")
    assert not auth.authorize(BOB, "h", "Write", "Topic", "order")
    assert not auth.authorize(ALICE, "h", "Describe", "Group", "anything")


def test_a_cached_decision_changes_when_the_acls_change():
    """Decisions are cached, and every update clears the cache."""
    auth = Authorizer()
    assert not auth.authorize(ALICE, "h", "Read", "Topic", "t")
    auth.update("Topic", "t", "LITERAL", {allow(ALICE, "Read")})
    assert auth.authorize(ALICE, "h", "Read", "Topic", "t")
    auth.update("Topic", "t", "LITERAL", set())
    assert not auth.authorize(ALICE, "h", "Read", "Topic", "t")


def test_public_words_become_kafkas_and_bad_ones_are_refused():
    """binding() takes the API's lower-case words; bad words, a prefixed '*', a cluster
    resource not named kafka-cluster and a principal without a type are IllegalArgumentError."""
    b = binding("User:alice", "topic", "t", "cluster_action", "deny", "prefixed")
    assert (b.resource_type, b.operation, b.permission, b.pattern_type) == \
        ("Topic", "ClusterAction", "Deny", "PREFIXED")
    assert b.as_dict()["operation"] == "cluster_action"
    for bad in [dict(resource_type="table"), dict(operation="fly"), dict(permission="maybe"),
                dict(pattern_type="regex"), dict(principal="alice"),
                dict(resource_name="*", pattern_type="prefixed"),
                dict(resource_type="cluster", resource_name="c1"),
                dict(resource_name="a/b"), dict(resource_name="")]:
        args = dict(principal="User:alice", resource_type="topic", resource_name="t",
                    operation="read", permission="allow", pattern_type="literal")
        args.update(bad)
        with pytest.raises(IllegalArgumentError):
            binding(**args)


def test_filters_match_kafkas_way():
    """A MATCH filter finds every pattern that applies to a name; None matches anything."""
    f = AclFilter(resource_type="Topic", name="orders.eu", pattern_type="MATCH")
    assert f.matches_pattern("Topic", "orders.", "PREFIXED")
    assert f.matches_pattern("Topic", "*", "LITERAL")
    assert not f.matches_pattern("Topic", "orders", "LITERAL")
    assert AclFilter(principal=ALICE).matches_entry(allow(ALICE, "Read"))
    assert not AclFilter(permission="Deny").matches_entry(allow(ALICE, "Read"))


# -- ZooKeeper ------------------------------------------------------------------------------

_ns = itertools.count()


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    server = start_zookeeper(tmp_path_factory.mktemp("zk"))
    yield server
    server.stop()


@pytest.fixture
def store(zk_server):
    namespace = f"acl{next(_ns)}"
    client = connect(ZkSettings(hosts=zk_server.hosts, namespace=namespace,
                                session_timeout_s=6.0))
    s = ZkStore(client)
    s.namespace, s.root = namespace, L.chroot_for(namespace)
    yield s
    client.close()


def test_acls_are_stored_as_kafkas_zookeeper_authorizer_stored_them(store, zk_server):
    """Literal and prefixed bindings land in /kafka-acl and /kafka-acl-extended/prefixed
    with Kafka's JSON, and each write posts a change notification in Kafka's form."""
    admin = AclAdmin(store)
    admin.create([binding(ALICE, "topic", "t", "read"),
                  binding(BOB, "group", "g.", "read", pattern_type="prefixed")])
    raw = plain_client(zk_server.hosts)
    try:
        body = json.loads(raw.get(store.root + "/kafka-acl/Topic/t")[0])
        assert body == {"version": 1, "acls": [{"principal": ALICE, "permissionType": "Allow",
                                                "operation": "Read", "host": "*"}]}
        body = json.loads(raw.get(store.root + "/kafka-acl-extended/prefixed/Group/g.")[0])
        assert body["acls"][0]["principal"] == BOB
        literal = raw.get_children(store.root + "/kafka-acl-changes")
        assert [raw.get(f"{store.root}/kafka-acl-changes/{n}")[0] for n in literal] == \
            [b"Topic:t"]
        (ext,) = raw.get_children(store.root + "/kafka-acl-extended-changes")
        assert json.loads(raw.get(f"{store.root}/kafka-acl-extended-changes/{ext}")[0]) == \
            {"version": 1, "resourceType": "Group", "name": "g.", "patternType": "PREFIXED"}
    finally:
        raw.stop()
        raw.close()


def test_delete_by_filter_removes_only_what_matches_and_the_empty_znode(store):
    """delete() answers what each filter removed; a pattern left without entries has no
    znode any more; describe() lists what is left."""
    admin = AclAdmin(store)
    admin.create([binding(ALICE, "topic", "t", "read"), binding(BOB, "topic", "t", "write"),
                  binding(ALICE, "topic", "u", "read")])
    (gone,) = admin.delete([AclFilter(resource_type="Topic", principal=ALICE)])
    assert sorted(b.name for b in gone) == ["t", "u"]
    assert store.get_acls("Topic", "u") == (frozenset(), -1)
    assert [(b.name, b.principal, b.operation) for b in admin.describe()] == \
        [("t", BOB, "Write")]


def test_concurrent_creates_on_one_resource_keep_every_entry(store):
    """Two writers adding to the same pattern at once: both entries survive (conditional
    writes, retried on a lost race)."""
    import threading
    admin = AclAdmin(store)
    users = [f"User:u{i}" for i in range(8)]
    threads = [threading.Thread(target=admin.create, args=([binding(u, "topic", "t", "read")],))
               for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries, _ = store.get_acls("Topic", "t")
    assert sorted(e.principal for e in entries) == users


def test_the_watcher_follows_changes_made_elsewhere(store, zk_server):
    """An AclWatcher loads the stored ACLs at start and applies later changes (made by
    another AclAdmin) to its Authorizer."""
    AclAdmin(store).create([binding(ALICE, "topic", "t", "read")])
    auth = Authorizer()
    watcher = AclWatcher(store, auth).start(timeout_s=10)
    try:
        assert auth.authorize(ALICE, "h", "Read", "Topic", "t")
        other = connect(ZkSettings(hosts=zk_server.hosts, namespace=store.namespace,
                                   session_timeout_s=6.0))
        try:
            AclAdmin(ZkStore(other)).create([binding(BOB, "topic", "t.", "write",
                                                     pattern_type="prefixed")])
            wait_until(lambda: auth.authorize(BOB, "h", "Write", "Topic", "t.x"),
                       timeout_s=10, what="the prefixed ACL reaches the watcher")
            AclAdmin(ZkStore(other)).delete([AclFilter(principal=ALICE)])
            wait_until(lambda: not auth.authorize(ALICE, "h", "Read", "Topic", "t"),
                       timeout_s=10, what="the deletion reaches the watcher")
        finally:
            other.close()
    finally:
        watcher.close()


def test_binding_dicts_use_the_public_words():
    """AclBinding.as_dict gives list_acls()'s form."""
    b = AclBinding("Topic", "t", "PREFIXED", ALICE, "*", "DescribeConfigs", "Allow")
    assert b.as_dict() == {"principal": ALICE, "host": "*", "resource_type": "topic",
                           "resource_name": "t", "pattern_type": "prefixed",
                           "operation": "describe_configs", "permission": "allow"}
