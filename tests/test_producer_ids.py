"""Producer ids from blocks reserved in ZooKeeper (coordination/producer_ids.py), against a
real ZooKeeper: Kafka's znode and JSON, and no id handed out twice by racing brokers."""

import json
import threading

import pytest

from coordination import zk_layout as L
from coordination.errors import ZkDataError
from coordination.producer_ids import ProducerIdManager
from coordination.session import ZkSettings, connect
from zk_helpers import plain_client, start_zookeeper


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    server = start_zookeeper(tmp_path_factory.mktemp("zk"))
    yield server
    server.stop()


def _client(zk_server, namespace):
    return connect(ZkSettings(hosts=zk_server.hosts, namespace=namespace,
                              session_timeout_s=6.0))


def test_blocks_of_1000_in_kafkas_json_and_ids_never_repeat_across_brokers(zk_server):
    """Two brokers (and threads in each) take ids at once: every id is unique, each
    broker's ids come from blocks of 1000, and /latest_producer_id_block holds Kafka's
    JSON of the last block (bounds as strings)."""
    a, b = _client(zk_server, "ids1"), _client(zk_server, "ids1")
    try:
        managers = [ProducerIdManager(a, 1), ProducerIdManager(b, 2)]
        got: list[list[int]] = [[] for _ in range(4)]

        def take(i):
            for _ in range(700):
                got[i].append(managers[i % 2].generate())
        threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ids = [pid for chunk in got for pid in chunk]
        assert len(ids) == 2800 == len(set(ids))
        assert max(ids) < 4000 and min(ids) >= 0
        raw = plain_client(zk_server.hosts)
        try:
            data, _ = raw.get(L.chroot_for("ids1") + L.PRODUCER_ID_BLOCK_PATH)
        finally:
            raw.stop()
            raw.close()
        body = json.loads(data)
        assert set(body) == {"version", "broker", "block_start", "block_end"}
        assert body["version"] == 1 and body["broker"] in (1, 2)
        start, end = int(body["block_start"]), int(body["block_end"])
        assert isinstance(body["block_start"], str) and end - start == 999
        assert start % 1000 == 0 and end >= max(ids)
        restarted = ProducerIdManager(a, 1)          # a new block: nothing handed out again
        assert restarted.generate() == end + 1
    finally:
        a.close()
        b.close()


def test_a_block_znode_that_is_not_a_block_is_a_data_error(zk_server):
    """Garbage in /latest_producer_id_block raises ZkDataError, never a reused id."""
    zk = _client(zk_server, "ids2")
    try:
        zk.create(L.PRODUCER_ID_BLOCK_PATH, b'{"version":1,"broker":1,"block_start":"9",'
                  b'"block_end":"3"}', makepath=True)
        with pytest.raises(ZkDataError):
            ProducerIdManager(zk, 1).generate()
    finally:
        zk.close()
