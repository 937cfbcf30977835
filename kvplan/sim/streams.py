"""Request streams, arrivals, the wait queue and the live requests of one simulated policy.

Memory stays proportional to the requests that are live (queued and preempted, or running), never to
the requests that went by: a stream is replayed, not stored (every policy, and each of the two cursors
of one policy, draws the same requests again from the same seed), and an open loop's queue of
never-scheduled arrivals is a count plus a cursor that re-draws each request when it reaches the head.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice

from kvplan.errors import InputError
from kvplan.sim.model import ClosedLoop, Request


class RequestSource:
    """Requests in index order, replayable: ``stream()`` returns a fresh iterator over the same requests.

    ``limit``: at most this many. ``expected``: how many the stream holds when known in advance (a list).
    """

    def __init__(self, stream: Callable[[], Iterator[Request]], limit: int | None = None,
                 expected: int | None = None) -> None:
        self._stream, self.limit, self.expected = stream, limit, expected

    @classmethod
    def of(cls, requests: Sequence[Request]) -> "RequestSource":
        items = tuple(requests)
        return cls(lambda: iter(items), expected=len(items))

    @classmethod
    def drawn(cls, make: Callable[[random.Random], Request | None], seed: int, limit: int | None = None) -> "RequestSource":
        """Requests drawn one after the other by ``make(rng)`` (None: no more) from ``random.Random(seed)``.

        ``make`` is called again for every replay, with a fresh generator: it must keep no state of its own
        (use :meth:`RequestSource` with a generator function for streams that need state).
        """

        def stream() -> Iterator[Request]:
            rng = random.Random(seed)
            while (req := make(rng)) is not None:
                yield req

        return cls(stream, limit)

    def cursor(self) -> Iterator[Request]:
        """A fresh pass over the requests (at most ``limit``)."""
        it = self._stream()
        return islice(it, self.limit) if self.limit is not None else it


class Live:
    """One request between its arrival and its finish (all counts in tokens).

    ``gen``: tokens sampled so far (kept current on preemption and finish); ``off``: a decoder holds
    ``D + off`` tokens of KV at step counter D; ``fin_d``: the counter value at which it finishes;
    ``synced``: tokens the allocator knows; ``pf_tokens``: tokens of its current prefill; ``epoch``:
    bumped on preemption (stale heap entries carry an older one).
    """

    __slots__ = ("index", "arrival", "prompt", "out", "gen", "first_sched", "first_token", "off", "fin_d",
                 "synced", "epoch", "pf_tokens", "prefix_id", "prefix_tokens")

    def __init__(self, index: int, req: Request, arrival: float, max_model_len: int) -> None:
        self.index = index
        self.arrival = arrival
        self.prompt = req.prompt_tokens
        self.out = min(req.output_tokens, max_model_len - req.prompt_tokens)
        self.gen = 0
        self.first_sched = -1.0
        self.first_token = -1.0
        self.off = self.fin_d = self.synced = self.epoch = self.pf_tokens = 0
        self.prefix_id, self.prefix_tokens = req.prefix_id, req.prefix_tokens


class Arrivals:
    """When requests arrive: an open loop (each request's ``arrival_s``, in index order) or a closed loop
    (each user's next request a think time after its previous one finished).

    Arrived requests go to the :class:`WaitQueue`; those whose prompt has ``max_model_len`` tokens or more
    are rejected (counted, never queued).
    """

    def __init__(self, source: RequestSource, closed: ClosedLoop | None, seed: int, max_model_len: int) -> None:
        self.source, self.closed, self.mml = source, closed, max_model_len
        self.think_rng = random.Random(seed * 7919 + 17)
        self._cursor = source.cursor()
        self._heap: list[tuple[float, int]] = []  # (time, index) not yet arrived
        self._pending: dict[int, Request] = {}  # closed loop: drawn, not yet arrived
        self._next_index = 0
        self.num_arrived = self.rejected = 0

    def start(self) -> None:
        if self.closed is None:
            self._push_open()
        else:
            for _ in range(self.closed.users):
                if not self._push_closed(self.think_rng.uniform(0.0, self.closed.start_spread_s)):
                    break

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def _push_open(self) -> None:
        req = next(self._cursor, None)
        if req is None:
            return
        if req.arrival_s is None:
            raise InputError("an open-loop request stream needs arrival times")
        heapq.heappush(self._heap, (req.arrival_s, self._next_index))
        self._pending[self._next_index] = req
        self._next_index += 1

    def _push_closed(self, at: float) -> bool:
        req = next(self._cursor, None)
        if req is None:
            return False
        heapq.heappush(self._heap, (at, self._next_index))
        self._pending[self._next_index] = req
        self._next_index += 1
        return True

    def pull(self, now: float, queue: "WaitQueue") -> bool:
        """Move every request arrived by ``now`` into ``queue``; True when the queue was empty before."""
        heap, was_empty = self._heap, not queue
        while heap and heap[0][0] <= now:
            at, i = heapq.heappop(heap)
            req = self._pending.pop(i)
            self.num_arrived += 1
            if self.closed is None:
                self._push_open()
            if req.prompt_tokens >= self.mml:
                self.rejected += 1
                self.user_done(at)
                continue
            if self.closed is None:
                queue.arrive_fresh()
            else:
                queue.append(Live(i, req, at, self.mml))
        return was_empty

    def user_done(self, at: float) -> None:
        """A request finished (or was rejected) at ``at``: a closed-loop user thinks, then sends the next."""
        if self.closed is not None:
            think = self.think_rng.expovariate(1.0 / self.closed.think_s) if self.closed.think_s > 0 else 0.0
            self._push_closed(at + think)


class WaitQueue:
    """Requests waiting to be scheduled, head first: explicit ones (preempted requests at the front,
    closed-loop arrivals) then, for an open loop, a count of fresh arrivals re-drawn from a second cursor
    over the same stream when they reach the head (so a queue of millions costs nothing)."""

    def __init__(self, source: RequestSource, max_model_len: int) -> None:
        self._front: deque[Live] = deque()
        self._fresh = 0  # open loop: arrived, accepted, not yet drawn by the cursor
        self._cursor = enumerate(source.cursor())
        self._mml = max_model_len

    def __len__(self) -> int:
        return len(self._front) + self._fresh

    def __bool__(self) -> bool:
        return bool(self._front) or self._fresh > 0

    def arrive_fresh(self) -> None:
        self._fresh += 1

    def append(self, live: Live) -> None:
        self._front.append(live)

    def push_front(self, live: Live) -> None:
        self._front.appendleft(live)

    def head(self) -> Live:
        if not self._front:
            for i, req in self._cursor:  # the arrival cursor rejected (and did not count) long prompts
                if req.prompt_tokens < self._mml:
                    assert req.arrival_s is not None
                    self._front.append(Live(i, req, req.arrival_s, self._mml))
                    self._fresh -= 1
                    break
        return self._front[0]

    def pop_head(self) -> Live:
        return self._front.popleft()
