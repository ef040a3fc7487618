"""`raykafka produce`'s check of its topic before it reads stdin (pure: a fake cluster)."""

from __future__ import annotations

import pytest

from actors.errors import UnknownTopicOrPartitionError
from actors.tools.cli import _check_topic_to_produce


class _Metadata:
    def __init__(self, known):
        self.known, self.asked = known, []

    def partitions_for(self, topic):
        self.asked.append(topic)
        if topic not in self.known:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return [0]


class _Cluster:
    def __init__(self, known=(), **config):
        self.metadata = _Metadata(set(known))
        self.config = {k.replace("_", "."): v for k, v in config.items()}


def test_an_unknown_topic_fails_before_stdin_only_where_the_cluster_never_creates_topics():
    """A topic the cluster lacks is fine to produce to when auto.create.topics.enable is
    on (the first line makes it) and an UnknownTopicOrPartitionError naming the setting
    when it is off; a known topic passes either way."""
    _check_topic_to_produce(_Cluster(auto_create_topics_enable="true"), "new")
    _check_topic_to_produce(_Cluster(), "new")                      # Kafka's default: on
    _check_topic_to_produce(_Cluster(known=["old"], auto_create_topics_enable="false"), "old")
    off = _Cluster(auto_create_topics_enable="false")
    with pytest.raises(UnknownTopicOrPartitionError, match="auto.create.topics.enable=false"):
        _check_topic_to_produce(off, "new")
    assert off.metadata.asked == ["new"]
