"""The scheduler's rules as rules: budgets, fair admission, skip-ahead with its age bound, preemption, time shares."""

from __future__ import annotations

import random

import pytest

from onnxmt.runtime.options import BatchLimits
from onnxmt.runtime.scheduler import Request, Scheduler


def request(texts: int, arrived: float = 0.0, cost: int = 10, preemptible: bool = True) -> Request:
    return Request([cost] * texts, arrived, preemptible)


def run(scheduler: Scheduler, now: float = 0.0) -> list[tuple[int, int]]:
    """Schedule and return the admitted (request id, text) pairs."""
    decision = scheduler.schedule(now)
    return [(id(r), t) for r, t in decision.admit]


def test_a_request_takes_the_free_places_one_text_at_a_time() -> None:
    s = Scheduler(BatchLimits(batch_size=32))
    big = request(64)
    s.add(big)
    admitted = s.schedule(0.0).admit
    assert [t for _, t in admitted] == list(range(32))
    assert s.texts == 32 and len(big.waiting) == 32
    assert not s.schedule(0.0)  # full: nothing changes


def test_a_one_text_request_beside_a_big_one_takes_a_reserved_place_at_once() -> None:
    s = Scheduler(BatchLimits(batch_size=32))  # a reserve of 32 / 8 = 4 places
    big = request(64)
    s.add(big)
    s.schedule(0.0)
    smalls = [request(1, arrived=0.5 + i) for i in range(5)]
    for small in smalls:
        s.add(small)
    decision = s.schedule(5.0)
    assert decision.admit == [(small, 0) for small in smalls]
    assert decision.preempt == [(big, 31)]  # four in the reserve (no work lost), the fifth in a place of big's
    assert s.texts == 36
    for small in smalls[:4]:
        s.finished(small, 0)
    assert not s.schedule(6.0)  # 32 running: big has texts running, so no reserved place
    s.finished(smalls[4], 0)
    assert s.schedule(6.0).admit == [(big, 31)]


def test_a_two_sentence_request_beside_a_big_one_runs_both_sentences_at_once() -> None:
    """Not one after the other: its second text also takes a reserved place while it holds less than its share
    (the service cuts a sentence-level model's text into sentences, so a short request is often two texts)."""
    s = Scheduler(BatchLimits(batch_size=32))  # a reserve of 4 places
    big = request(64)
    s.add(big)
    s.schedule(0.0)
    short = request(2, arrived=1.0)
    s.add(short)
    assert s.schedule(1.0).admit == [(short, 0), (short, 1)]
    assert s.texts == 34
    # Two more: the reserve's last two places go to their first texts (the fewest running first); their second
    # texts wait for places (nobody's work is lost for a request that already runs).
    shorts = [request(2, arrived=2.0 + i) for i in range(2)]
    for r in shorts:
        s.add(r)
    decision = s.schedule(3.0)
    assert decision.admit == [(shorts[0], 0), (shorts[1], 0)] and not decision.preempt
    assert s.texts == 36


def test_with_the_reserve_taken_a_one_text_request_takes_a_place_from_a_big_one() -> None:
    s = Scheduler(BatchLimits(batch_size=32, reserve=0))
    big = request(64)
    s.add(big)
    s.schedule(0.0)
    small = request(1, arrived=0.5)
    s.add(small)
    decision = s.schedule(0.5)
    assert decision.admit == [(small, 0)]
    assert decision.preempt == [(big, 31)]  # the text admitted last: the least work lost
    assert s.texts == 32
    assert list(big.waiting)[:2] == [31, 32]  # it waits again, first of its request
    # When the small request's text finishes, its place goes back to the big request's text.
    s.finished(small, 0)
    assert s.schedule(0.6).admit == [(big, 31)]


def test_nobody_is_preempted_at_or_below_their_share() -> None:
    s = Scheduler(BatchLimits(batch_size=4, reserve=0))
    ones = [request(1, arrived=i) for i in range(4)]
    for r in ones:
        s.add(r)
    assert len(s.schedule(4.0).admit) == 4
    late = request(1, arrived=5.0)
    s.add(late)
    assert not s.schedule(5.0)  # every running request holds one text: late waits for a place
    s.finished(ones[2], 0)
    assert s.schedule(6.0).admit == [(late, 0)]


def test_two_big_requests_share_the_places_as_texts_finish() -> None:
    s = Scheduler(BatchLimits(batch_size=8, reserve=0))
    a, b = request(16, arrived=0.0), request(16, arrived=1.0)
    s.add(a)
    s.schedule(0.0)
    s.add(b)
    decision = s.schedule(1.0)
    assert decision.admit == [(b, 0)] and decision.preempt == [(a, 7)]  # b gets one place at once
    for text in list(a.running):  # a's texts finish together: the places are shared, one to the one with fewer
        s.finished(a, text)
    s.schedule(2.0)
    assert (len(a.running), len(b.running)) == (4, 4)


def test_a_request_that_does_not_fit_does_not_block_later_ones_that_do() -> None:
    s = Scheduler(BatchLimits(batch_size=8, max_batch_cost=100, max_skip_age=2.0, reserve=0))
    running = request(1, cost=60)
    s.add(running)
    s.schedule(0.0)
    big = request(1, arrived=1.0, cost=50)  # 60 + 50 > 100
    small = request(1, arrived=1.5, cost=30)
    s.add(big)
    s.add(small)
    assert s.schedule(1.5).admit == [(small, 0)]
    assert list(big.waiting) == [0]


def test_a_request_that_waited_max_skip_age_is_not_passed() -> None:
    s = Scheduler(BatchLimits(batch_size=8, max_batch_cost=100, max_skip_age=2.0, reserve=0))
    running = request(1, cost=60)
    s.add(running)
    s.schedule(0.0)
    big = request(1, arrived=1.0, cost=50)
    s.add(big)
    s.schedule(1.0)
    small = request(1, arrived=3.5, cost=30)
    s.add(small)
    assert not s.schedule(3.5)  # big has waited 2.5 s with nothing running: small waits behind it
    s.finished(running, 0)
    assert s.schedule(3.6).admit == [(big, 0), (small, 0)]


def test_a_stream_is_never_preempted() -> None:
    s = Scheduler(BatchLimits(batch_size=4, reserve=0))
    stream = request(8, preemptible=False)
    s.add(stream)
    s.schedule(0.0)
    s.add(request(1, arrived=1.0))
    assert not s.schedule(1.0)


def test_a_dry_run_changes_nothing() -> None:
    s = Scheduler(BatchLimits(batch_size=4, reserve=0))
    big = request(8)
    s.add(big)
    s.schedule(0.0)
    small = request(1, arrived=1.0)
    s.add(small)
    assert s.schedule(1.0, commit=False)
    assert (list(big.running), list(big.waiting), list(small.waiting), s.texts) == ([0, 1, 2, 3], [4, 5, 6, 7], [0], 4)


def test_a_dropped_request_never_runs_its_waiting_texts() -> None:
    s = Scheduler(BatchLimits(batch_size=2))
    a = request(4)
    s.add(a)
    s.schedule(0.0)
    s.drop(a)
    for text in list(a.running):
        s.finished(a, text)
    assert not s.schedule(1.0) and s.requests == [] and s.texts == 0


@pytest.mark.parametrize("seed", range(5))
def test_the_budgets_are_never_exceeded_under_random_load(seed: int) -> None:
    rng = random.Random(seed)
    limits = BatchLimits(batch_size=16, max_batch_cost=400, max_skip_age=rng.choice([0.5, 2.0]))
    s = Scheduler(limits)
    now, done = 0.0, 0
    total = 0
    for _ in range(400):
        now += rng.random() * 0.2
        if rng.random() < 0.3:
            r = Request([rng.randint(5, 120) for _ in range(rng.randint(1, 20))], now, rng.random() < 0.8)
            s.add(r)
            total += len(r.costs)
        decision = s.schedule(now)
        running = [(r, t) for r in s.requests for t in r.running]
        assert len(running) == s.texts <= limits.batch_size + limits.reserved
        assert s.cost == sum(r.costs[t] for r, t in running)
        assert s.cost <= limits.max_batch_cost or s.texts == 1  # a text alone always fits
        assert all(r.preemptible for r, _ in decision.preempt)
        for r, t in running:  # finish some
            if rng.random() < 0.2:
                s.finished(r, t)
                done += 1
    # Every text eventually runs once the arrivals stop.
    for _ in range(10_000):
        now += 0.1
        s.schedule(now)
        running = [(r, t) for r in s.requests for t in r.running]
        if not running and not s.waiting:
            break
        for r, t in running:
            s.finished(r, t)
            done += 1
    assert done == total


def test_beam_widths_share_the_time_by_request() -> None:
    s = Scheduler(BatchLimits(batch_size=32))
    steps = {1: 0, 4: 0}
    seconds = {1: 0.004, 4: 0.05}  # a one-row greedy step and a 64-row beam step
    requests = {1: 1, 4: 2}
    for _ in range(300):
        width = s.next_width([1, 4])
        steps[width] += 1
        s.stepped(width, seconds[width], requests[width])
    # Each request's share of the time: the greedy request 1/3, the two beam requests 2/3.
    greedy_time, beam_time = steps[1] * seconds[1], steps[4] * seconds[4]
    assert greedy_time / (greedy_time + beam_time) == pytest.approx(1 / 3, abs=0.03)


def _picks(s: Scheduler, steps: int, seconds: dict[int, float], requests: dict[int, int]) -> list[int]:
    """The widths `s` picks for `steps` steps of a greedy and a beam-4 batch, each step charged as given."""
    picks = []
    for _ in range(steps):
        width = s.next_width([1, 4])
        picks.append(width)
        s.stepped(width, seconds[width], requests[width])
    return picks


def test_a_width_that_starts_has_three_turns_of_credit_and_none_saved() -> None:
    s = Scheduler(BatchLimits(batch_size=32))
    for _ in range(100):
        s.stepped(s.next_width([4]), 0.05, 1)
    picks = _picks(s, 10, {1: 0.05, 4: 0.05}, {1: 1, 4: 1})
    # Three turns owed (what the running request got from three steps; the fourth greedy step wins a tie of equal
    # charges), then they alternate; not greedy steps only for the 5 s of credit the idle greedy width would have
    # saved.
    assert picks == [1, 1, 1, 1, 4, 1, 4, 1, 4, 1]


def test_a_one_text_request_beside_a_long_beam_batch_takes_its_turn_at_once() -> None:
    """A greedy request that starts beside a 128-row beam batch of three requests (a step of 90 ms, 30 ms to each)
    takes three turns of 30 ms in its 7 ms steps (13 of them: a short text's whole translation) before the beam
    batch steps again, then shares the time by request (30 ms of greedy steps to each beam step)."""
    s = Scheduler(BatchLimits(batch_size=32))
    for _ in range(20):
        s.stepped(s.next_width([4]), 0.09, 3)
    picks = _picks(s, 24, {1: 0.007, 4: 0.09}, {1: 1, 4: 3})
    assert picks == [1] * 13 + [4] + [1] * 5 + [4] + [1] * 4


def test_a_full_batch_of_one_text_requests_takes_no_reserved_place() -> None:
    """The reserve is for a request beside one that holds more than its share, not a larger batch under a flood of
    one-text requests (their encoding is pooled while they wait)."""
    s = Scheduler(BatchLimits(batch_size=8, reserve=2))
    for i in range(12):
        s.add(request(1, arrived=float(i)))
    assert len(s.schedule(12.0).admit) == 8
    assert s.texts == 8
