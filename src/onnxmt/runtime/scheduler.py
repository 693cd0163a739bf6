"""Which texts run: waiting texts -> running batches, decided apart from running them.

As vLLM's scheduler splits `schedule()` from `update_from_output()`, this module only decides: which waiting texts
join the running batches now (`schedule`), which running text gives its place back (preemption), which beam
width's batch takes the next step (`next_width`), and what changes when texts finish (`finished`). It calls no
model and knows no asyncio; the library's long inputs (Translator.generate) and the service's requests
(serve/inflight.py) drive it alike, and a prompt without an encoder is one more text to it.

Fairness is a property of admission:

- A request's texts are admitted one by one, the next place to the waiting request with the fewest texts running
  (then the oldest), so that no request runs alone ahead of everyone: a 64-text request takes the places that are
  free, and a one-text request that arrives meanwhile takes the next one.
- A waiting request whose next text does not fit does not block later ones that do, unless it has waited
  `max_skip_age` seconds: then nothing is admitted past it until it fits (no starvation of big texts).
- A waiting request holding less than its share may take one of a few places kept past `batch_size` (`reserve`)
  while a request holds more than its share: a one-text request (or a two-sentence one) beside a 64-text one
  starts at the next step, and nobody's work is lost. When those are taken too, a request with nothing running
  takes a place from the request with the most texts running, if that one holds more than its share (running
  texts over the requests running or waiting): its text admitted last (the least progress: the least work lost)
  leaves and waits again at the front of its request. Its translation is computed again from the start, and is
  the same (a row's results do not depend on its batch).
- Beam widths run in separate batches (one decoder call holds one width) and share the time by request: each
  width's step time is charged to it divided by the requests it runs, and the width charged least steps next; a
  width that starts is owed three turns (what each running request got from three steps), none saved from idle
  time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .options import BatchLimits

# The turns a beam width that starts is owed (see `Scheduler.next_width`): three turns let a one-text request
# beside beam-4 batches of 16-text requests finish in about three of their steps (p50 2.1x idle, max 6.8-7.8x over
# three rounds, against 4.3-4.7x and 9.7-13x with one turn; benchmarks/mixed_load.py --scenario queued-beams).
OWED_TURNS = 3


@dataclass(eq=False)
class Request:
    """A request's texts as the scheduler sees them: each text's cost (tokens x beams), the request's arrival;
    `preemptible`: whether its running texts may give their place back (not when its tokens are streamed as they
    come)."""

    costs: Sequence[int]
    arrived: float
    preemptible: bool = True
    waiting: deque[int] = field(init=False)
    running: list[int] = field(init=False, default_factory=list)  # in the order admitted
    left: int = field(init=False)  # texts not finished

    def __post_init__(self) -> None:
        self.waiting = deque(range(len(self.costs)))
        self.left = len(self.costs)


@dataclass
class Decision:
    """What `schedule` decided: (request, text) pairs to add to the running batches, and running ones to take out
    before the next step (they wait again)."""

    admit: list[tuple[Request, int]] = field(default_factory=list)
    preempt: list[tuple[Request, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.admit or self.preempt)


class Scheduler:
    """Waiting requests and the texts running, within `limits`."""

    def __init__(self, limits: BatchLimits) -> None:
        self.limits = limits
        self.requests: list[Request] = []  # in arrival order: those with texts waiting or running
        self.texts = 0  # texts running
        self.cost = 0  # their tokens x beams
        self._charged: dict[int, float] = {}  # beam width -> seconds charged
        self._turn: dict[int, float] = {}  # beam width -> what its last step charged each of its requests

    def add(self, request: Request) -> None:
        self.requests.append(request)

    def drop(self, request: Request) -> None:
        """A request gone (cancelled, timed out): its waiting texts never run. Its running texts leave the batch
        by themselves (cancelled at the next step) and are counted out by `finished`."""
        request.waiting.clear()
        if not request.running and request in self.requests:
            self.requests.remove(request)

    @property
    def waiting(self) -> int:
        """Texts waiting."""
        return sum(len(r.waiting) for r in self.requests)

    def fits(
        self, request: Request, text: int, texts: int | None = None, cost: int | None = None, reserve: bool = False
    ) -> bool:
        """Whether `request`'s `text` fits beside `texts` texts of `cost` running (default: those running now), in
        the `reserve` places past `batch_size` too if it may take one. A text alone always fits: the budgets bound a
        batch, not what one text may cost (the request limits do)."""
        texts = self.texts if texts is None else texts
        cost = self.cost if cost is None else cost
        if texts == 0:
            return True
        places = self.limits.batch_size + (self.limits.reserved if reserve else 0)
        if texts + 1 > places:
            return False
        budget = self.limits.max_batch_cost
        return budget is None or cost + request.costs[text] <= budget

    def schedule(self, now: float, commit: bool = True) -> Decision:
        """The texts that join now and the ones that give their place back; with `commit`, counted as running (or
        waiting again) at once. Without, nothing changes: only whether anything would (`bool(decision)`)."""
        decision = Decision()
        texts, cost = self.texts, self.cost
        held = {id(r): list(r.running) for r in self.requests}  # running before this call, and still
        count = {id(r): len(r.running) for r in self.requests}  # running, with those admitted in this call
        waiting = {id(r): deque(r.waiting) for r in self.requests}
        blocked: set[int] = set()
        while True:
            candidates = [r for r in self.requests if waiting[id(r)] and id(r) not in blocked]
            if not candidates:
                break
            request = min(candidates, key=lambda r: (count[id(r)], r.arrived))
            text = waiting[id(request)][0]
            if self.fits(request, text, texts, cost, self._may_reserve(request, count, texts)):
                waiting[id(request)].popleft()
                if (request, text) in decision.preempt:  # it never left
                    decision.preempt.remove((request, text))
                    held[id(request)].append(text)
                else:
                    decision.admit.append((request, text))
                texts, cost = texts + 1, cost + request.costs[text]
                count[id(request)] += 1
                continue
            victim = self._victim(request, text, count, held, texts, cost)
            if victim is not None:
                gone = held[id(victim)].pop()
                decision.preempt.append((victim, gone))
                waiting[id(victim)].appendleft(gone)
                count[id(victim)] -= 1
                texts, cost = texts - 1, cost - victim.costs[gone]
                continue  # the place is free: `request` takes it next
            if count[id(request)] == 0 and now - request.arrived >= self.limits.max_skip_age:
                break  # it has waited long enough with nothing running: nobody passes it
            blocked.add(id(request))
        if commit:
            for request in self.requests:
                request.waiting = waiting[id(request)]
            for request, text in decision.preempt:
                request.running.remove(text)
            for request, text in decision.admit:
                request.running.append(text)
            self.texts, self.cost = texts, cost
        return decision

    def _may_reserve(self, request: Request, count: dict[int, int], texts: int) -> bool:
        """Whether `request` may take a reserved place: it holds less than its share (the texts running over the
        requests running or waiting), and another request holds more. So a short request of two sentences beside a
        big one runs both at once, not one after the other. Not when every request holds one text (a full batch of
        one-text requests): there the reserve would only make the batch larger."""
        active = sum(1 for r in self.requests if count[id(r)] or r.waiting)
        if count[id(request)] * active >= texts:
            return False
        return any(n >= 2 and n * active > texts for n in count.values())

    def _victim(
        self, request: Request, text: int, count: dict[int, int], held: dict[int, list[int]], texts: int, cost: int
    ) -> Request | None:
        """The request that gives `request` (nothing running) a place for its `text`: the one with the most texts
        running, if it holds more than its share (the texts running over the requests running or waiting), may give
        one back, and one place is enough."""
        if count[id(request)] or texts == 0:
            return None
        holders = [r for r in self.requests if held[id(r)] and r.preemptible]
        if not holders:
            return None
        victim = max(holders, key=lambda r: (count[id(r)], -r.arrived))
        active = sum(1 for r in self.requests if count[id(r)] or r.waiting)
        if count[id(victim)] < 2 or count[id(victim)] * active <= texts:
            return None
        freed = cost - victim.costs[held[id(victim)][-1]]
        if not self.fits(request, text, texts - 1, freed, self._may_reserve(request, count, texts)):
            return None
        return victim

    def finished(self, request: Request, text: int) -> None:
        """A running text left the batch (finished or cancelled)."""
        request.running.remove(text)
        request.left -= 1
        self.texts -= 1
        self.cost -= request.costs[text]
        if not request.running and not request.waiting and request in self.requests:
            self.requests.remove(request)

    def next_width(self, widths: Iterable[int]) -> int:
        """Which beam width's batch steps next, of `widths` (those with rows): the one charged least. A width that
        starts is charged as the least charged running one less `OWED_TURNS` turns (a turn: the most a running
        width's last step charged each of its requests): a request that arrives is owed what each running request
        got from that many steps, so that a one-text request beside a long beam batch takes its first steps at once
        and a short one finishes, but it has no credit saved from idle time."""
        widths = list(widths)
        floor = min((self._charged[w] for w in widths if w in self._charged), default=0.0)
        turn = OWED_TURNS * max((self._turn.get(w, 0.0) for w in widths if w in self._charged), default=0.0)
        for w in widths:
            self._charged[w] = max(self._charged.get(w, floor - turn), floor - turn)
        for w in list(self._charged):
            if w not in widths:
                del self._charged[w]
                self._turn.pop(w, None)
        return min(widths, key=lambda w: (self._charged[w], w))

    def stepped(self, width: int, seconds: float, requests: int) -> None:
        """Charge a step of `width` that took `seconds` for `requests` requests."""
        self._turn[width] = seconds / max(requests, 1)
        self._charged[width] = self._charged.get(width, 0.0) + self._turn[width]
