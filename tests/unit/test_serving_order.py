"""The ``order`` option: a script of worker ranks, read as docs/asgd.md says, in one process.

The serve loops that follow it (the parameter server, the elastic master) are tested at
several ranks in tests/mpi (test_ps.py, test_easgd.py, test_replay_scripted.py); here the
script's reading alone: what a script writes out to, which worker comes next, what is
skipped, what is refused.
"""

import pytest

from minidp.run.config import strategy_options
from minidp.strategies.serving import MAX_SCRIPT, ServingOrder, is_order, parse_script


def taken(order, active, times, waiting=lambda worker: False):
    return [order.next(active, waiting) for _ in range(times)]


def test_a_script_writes_out_its_repeats_in_place():
    assert parse_script("2,3,1x4,2") == (2, 3, 1, 1, 1, 1, 2)
    assert parse_script(" 1 , 2 x 2 ") == (1, 2, 2)
    assert parse_script("7") == (7,)
    assert parse_script(f"1x{MAX_SCRIPT - 1},2") is not None


@pytest.mark.parametrize("text", ["", "1,,2", "1,", "one", "1x0", "1x", "x2", "-1", "1.5",
                                  "1x2x3", "1;2", f"1x{MAX_SCRIPT},2", "fcfs,1",
                                  "1" * 5000, "1x" + "9" * 5000])
def test_what_is_not_a_script_is_none(text):
    assert parse_script(text) is None
    assert not is_order(text)


def test_the_named_orders_are_orders_and_nothing_near_them():
    assert is_order("fcfs") and is_order("round_robin") and is_order("3,1x2")
    assert not is_order("FCFS") and not is_order("round-robin") and not is_order("script")


def test_a_script_is_taken_in_turn_and_cycles():
    order = ServingOrder("2,3,1x2", [1, 2, 3], "asgd.order", 0)
    assert taken(order, [1, 2, 3], 9) == [2, 3, 1, 1, 2, 3, 1, 1, 2]


def test_round_robin_is_every_worker_once_in_rank_order_skipping_who_left():
    # The former rule, a turn index into the active workers that stays in place when the
    # worker at it leaves: 1 2 3 1, then 2 leaves after its turn, 3 1 3 1
    order = ServingOrder("round_robin", [1, 2, 3], "easgd-async.order", 0)
    assert taken(order, [1, 2, 3], 5) == [1, 2, 3, 1, 2]
    assert taken(order, [1, 3], 4) == [3, 1, 3, 1]


def test_a_worker_that_left_or_waits_for_the_server_is_skipped():
    order = ServingOrder("1x2,2,3", [1, 2, 3], "dbs.order", 0)
    assert taken(order, [1, 2, 3], 2) == [1, 1]
    assert taken(order, [1, 2, 3], 3, waiting=lambda worker: worker == 1) == [2, 3, 2]
    assert taken(order, [1, 2], 3) == [1, 1, 2]  # 3 left: its entry passes


def test_every_epoch_starts_at_the_first_entry():
    order = ServingOrder("3,1,2", [1, 2, 3], "asgd.order", 0)
    assert taken(order, [1, 2, 3], 2) == [3, 1]
    order.restart()
    assert taken(order, [1, 2, 3], 3) == [3, 1, 2]


def test_first_come_first_served_names_no_worker():
    order = ServingOrder("fcfs", [1, 2, 3], "asgd.order", 0)
    assert order.next([1, 2, 3]) is None
    assert order.script is None


def test_a_script_of_other_ranks_or_one_that_leaves_a_worker_out_is_refused():
    with pytest.raises(ValueError, match=r"^rank 2: asgd.order: got '1,5,2,3' \(5 not a "
                                         r"worker\), allowed: the worker ranks 1, 2, 3, each "
                                         r"named at least once$"):
        ServingOrder("1,5,2,3", [1, 2, 3], "asgd.order", 2)
    with pytest.raises(ValueError, match=r"^rank 0: softsync.order: got '1x3,3' \(worker\(s\) "
                                         r"2 never named\)"):
        ServingOrder("1x3,3", [1, 2, 3], "softsync.order", 0)
    with pytest.raises(ValueError, match=r"^rank 1: asgd.order: got '1,,2', allowed: fcfs"):
        ServingOrder("1,,2", [1, 2], "asgd.order", 1)


def test_no_worker_that_can_send_is_an_error_not_a_wait():
    order = ServingOrder("1,2", [1, 2], "dbs.order", 0)
    with pytest.raises(RuntimeError, match=r"order '1,2': none of the active workers \[1, 2\] "
                                           "can send a message"):
        order.next([1, 2], waiting=lambda worker: True)


@pytest.mark.parametrize("strategy", ["asgd", "amsgd", "softsync", "dbs", "easgd-async",
                                      "measgd-async"])
def test_the_option_is_checked_with_the_others_before_any_rank_starts(strategy):
    assert strategy_options(strategy, {"order": "3,1x2,2"})["order"] == "3,1x2,2"
    with pytest.raises(ValueError, match=rf"^{strategy}.order: got '1,x', allowed: fcfs \(first "
                                         r"come first served\), round_robin .* or a script: "
                                         r"worker ranks separated by commas, RxN"):
        strategy_options(strategy, {"order": "1,x"})
