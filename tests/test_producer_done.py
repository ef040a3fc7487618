"""The producer batch's settled flag (accumulator.Done): an Event's is_set / set / wait
whose Event is made only for a waiter. Pure, no broker."""

import threading
import time

from actors.client.accumulator import Done


def test_done_wakes_a_waiter_set_from_another_thread_and_times_out_unset():
    """wait() returns True once another thread sets the flag, False at its timeout when
    nobody does, and True at once after the flag is set."""
    unset = Done()
    t0 = time.monotonic()
    assert unset.wait(0.05) is False and time.monotonic() - t0 >= 0.04
    done = Done()
    setter = threading.Timer(0.05, done.set)
    setter.start()
    assert done.wait(10) is True and done.is_set()
    assert done.wait(0) is True
    setter.join()


def test_done_set_racing_the_first_wait_never_leaves_the_waiter_hanging():
    """Set and the first wait racing (the Event made while the flag is being set): every
    waiter sees the flag within its timeout, in 2,000 races."""
    for _ in range(2000):
        done = Done()
        setter = threading.Thread(target=done.set)
        setter.start()
        assert done.wait(5) is True
        setter.join()
