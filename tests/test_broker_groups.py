"""BrokerGroups, the broker's side of the group APIs (actors/server/group_handlers.py),
with a fake coordinator handle: how a coordinator's NOT_COORDINATOR is answered while
the broker already leads the group's offsets partition."""

from __future__ import annotations

import concurrent.futures

import pytest

from actors.errors import CoordinatorLoadInProgressError, NotCoordinatorError
from actors.server.group_handlers import BrokerGroups


class _Method:
    def __init__(self, outcome):
        self.outcome = outcome

    def remote(self, *args):
        return self

    def future(self):
        f = concurrent.futures.Future()
        if isinstance(self.outcome, BaseException):
            f.set_exception(self.outcome)
        else:
            f.set_result(self.outcome)
        return f


class _Coordinator:
    """Every method answers ``outcome`` (a value, or an exception to raise)."""

    def __init__(self, outcome):
        self.outcome = outcome

    def __getattr__(self, name):
        return _Method(self.outcome)


def _groups(handle, led=("mine",)):
    return BrokerGroups(lambda g: {"broker_id": 0}, lambda: handle, 0,
                        leads=lambda group: group in led)


def test_not_coordinator_for_a_group_whose_partition_the_broker_leads_is_loading():
    """The coordinator has not heard of a partition its broker already leads: the client
    is told COORDINATOR_LOAD_IN_PROGRESS (retry here), not NOT_COORDINATOR (look up
    again, which names this broker anyway); for a group led elsewhere, NOT_COORDINATOR."""
    groups = _groups(_Coordinator(NotCoordinatorError("not the coordinator of it")))
    with pytest.raises(CoordinatorLoadInProgressError, match="taking it over"):
        groups.call("fetch_offsets", "mine", None).result(1)
    with pytest.raises(CoordinatorLoadInProgressError):
        groups.call("join_group", "mine", "", "consumer", [], 10000, 10000).result(1)
    with pytest.raises(NotCoordinatorError):
        groups.call("fetch_offsets", "theirs", None).result(1)


def test_a_broker_without_a_coordinator_yet_answers_loading_for_a_group_it_leads():
    """No coordinator actor yet (the first offsets partition is being applied): loading
    for a group whose partition the broker leads, NOT_COORDINATOR otherwise."""
    groups = _groups(None)
    with pytest.raises(CoordinatorLoadInProgressError):
        groups.call("heartbeat", "mine", "m", 1).result(1)
    with pytest.raises(NotCoordinatorError):
        groups.call("heartbeat", "theirs", "m", 1).result(1)


def test_answers_and_other_errors_pass_through():
    """A coordinator's answer comes back as it is; errors other than NOT_COORDINATOR and
    calls without a group (list_groups_detail) are not touched."""
    assert _groups(_Coordinator({"g": 1})).call("fetch_offsets", "mine", None).result(1) \
        == {"g": 1}
    with pytest.raises(ValueError):
        _groups(_Coordinator(ValueError("x"))).call("fetch_offsets", "mine").result(1)
    with pytest.raises(NotCoordinatorError):
        _groups(_Coordinator(NotCoordinatorError("none")), led=("mine", None)).call(
            "list_groups_detail").result(1)
