"""Prometheus text pages in the formats vLLM (V1 and V0) and SGLang document for ``/metrics``, a loopback
HTTP server that replays them, and simulated time for the observe runs that poll it.

The pages are written here from the engines' documented metric definitions (names, types, HELP lines,
labels: vLLM V1 ``model_name`` + ``engine``, V0 ``model_name``, SGLang ``model_name`` and, in newer
releases, rank labels); values come from the test (a string is written as given: ``"NaN"``, ``"+Inf"``).
Counters are exposed with ``_total`` and a ``_created`` gauge, as prometheus_client writes them. Nothing
here is a captured page.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _labels(labels: dict[str, Any]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _value(value: Any) -> str:
    """A sample value as the text format writes it: a number, or a string as given ("NaN", "+Inf", "-Inf")."""
    return value if isinstance(value, str) else repr(float(value))


def _family(name: str, kind: str, help_text: str, rows: Iterable[tuple[dict[str, Any], Any]]) -> list[str]:
    rows = [(labels, value) for labels, value in rows if value is not None]
    if not rows:
        return []
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    out += [f"{name}{_labels(labels)} {_value(value)}" for labels, value in rows]
    if kind == "counter":
        base = name.removesuffix("_total")
        out += [f"# HELP {base}_created {help_text}", f"# TYPE {base}_created gauge"]
        out += [f"{base}_created{_labels(labels)} 1.7e+09" for labels, _ in rows]
    return out


def _histogram(name: str, help_text: str, labels: dict[str, Any]) -> list[str]:
    """An unrelated histogram (time to first token) so pages hold more than what kvplan reads."""
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for le, count in (("0.1", 3.0), ("1.0", 7.0), ("+Inf", 8.0)):
        out.append(f"{name}_bucket{_labels({**labels, 'le': le})} {count}")
    out += [f"{name}_count{_labels(labels)} 8.0", f"{name}_sum{_labels(labels)} 2.5"]
    return out


PROCESS = ["# HELP python_gc_objects_collected_total Objects collected during gc",
           "# TYPE python_gc_objects_collected_total counter",
           'python_gc_objects_collected_total{generation="0"} 1234.0']

V1_METRICS = [  # (key in a series dict, name, type, help)
    ("running", "vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("waiting", "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("gpu_usage", "vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED."),
    ("usage", "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("queries", "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens."),
    ("hits", "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    ("preemptions", "vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine."),
    ("prompt", "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("generation", "vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
]
V0_METRICS = [
    ("running", "vllm:num_requests_running", "gauge", "Number of requests currently running on GPU."),
    ("waiting", "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("swapped", "vllm:num_requests_swapped", "gauge", "Number of requests swapped to CPU."),
    ("usage", "vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage."),
    ("cpu_usage", "vllm:cpu_cache_usage_perc", "gauge", "CPU KV-cache usage. 1 means 100 percent usage."),
    ("hit_rate", "vllm:gpu_prefix_cache_hit_rate", "gauge", "GPU prefix cache block hit rate."),
    ("preemptions", "vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine."),
    ("prompt", "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("generation", "vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
]
SGLANG_SCHEDULER = [
    ("running", "sglang:num_running_reqs", "gauge", "The number of running requests."),
    ("used_tokens", "sglang:num_used_tokens", "gauge", "The number of used tokens."),
    ("usage", "sglang:token_usage", "gauge", "The token usage."),
    ("waiting", "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue."),
    ("hit_rate", "sglang:cache_hit_rate", "gauge", "The prefix cache hit rate."),
    ("max_tokens", "sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool."),
    ("retracted", "sglang:num_retracted_requests_total", "counter", "Total number of retracted requests."),
]
SGLANG_TOKENIZER = [
    ("prompt", "sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("generation", "sglang:generation_tokens_total", "counter", "Number of generation tokens processed."),
]


def _page(table: list[tuple[str, str, str, str]], series: list[dict[str, Any]], label_keys: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for key, name, kind, help_text in table:
        out += _family(name, kind, help_text, [({k: s[k] for k in label_keys if k in s}, s.get(key)) for s in series])
    return out


def vllm_v1_page(*series: dict[str, Any], config: dict[str, Any] | None = None, deprecated_names: bool = False,
                 cache_config: bool = True) -> str:
    """vLLM V1: every metric labelled ``model_name`` and ``engine``; ``vllm:cache_config_info`` per engine
    (labels: the cache config and ``engine``). ``config``: labels overriding the defaults below, or per
    engine under ``series[i]["config"]``. ``deprecated_names``: also the 0.9/0.10 deprecated usage gauge;
    ``cache_config=False``: no ``vllm:cache_config_info`` (as before the engine has sized its cache)."""
    series = tuple({"model_name": MODEL, "engine": "0", **s} for s in series)
    table = [m for m in V1_METRICS if deprecated_names or m[0] != "gpu_usage"]
    if deprecated_names:
        for s in series:
            s.setdefault("gpu_usage", s.get("usage"))
    lines = _histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                       {"engine": series[0]["engine"], "model_name": series[0]["model_name"]})
    lines += _page(table, list(series), ("engine", "model_name"))
    rows = []
    for s in series:
        cfg = {"block_size": "16", "cache_dtype": "auto", "calculate_kv_scales": "False", "cpu_offload_gb": "0",
               "enable_prefix_caching": "True", "engine": s["engine"], "gpu_memory_utilization": "0.92",
               "is_attention_free": "False", "num_cpu_blocks": "None", "num_gpu_blocks": "27732",
               "num_gpu_blocks_override": "None", "sliding_window": "None", "swap_space": "4"}
        cfg.update({k: str(v) for k, v in (config or {}).items()})
        cfg.update({k: str(v) for k, v in s.get("config", {}).items()})
        rows.append((dict(sorted(cfg.items())), 1.0))
    if cache_config:
        lines += _family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", rows)
    return "\n".join(PROCESS + lines) + "\n"


def vllm_v0_page(*series: dict[str, Any], num_gpu_blocks: int = 27732, block_size: int = 16) -> str:
    """vLLM V0: labels ``model_name`` only; ``vllm:cache_config_info`` from an Info (config labels, no model)."""
    series = tuple({"model_name": MODEL, **s} for s in series)
    lines = _page(V0_METRICS, list(series), ("model_name",))
    cfg = {"block_size": block_size, "cache_dtype": "auto", "enable_prefix_caching": "True",
           "gpu_memory_utilization": "0.9", "num_cpu_blocks": "2048", "num_gpu_blocks": num_gpu_blocks, "swap_space": "4"}
    lines += _family("vllm:cache_config_info", "gauge", "information of cache_config", [(cfg, 1.0)])
    return "\n".join(PROCESS + lines) + "\n"


def sglang_page(*series: dict[str, Any], ranks: bool = False) -> str:
    """SGLang: scheduler gauges labelled ``model_name`` (plus ``engine_type``/``tp_rank``/``pp_rank`` with
    ``ranks``), tokenizer counters labelled ``model_name`` only."""
    series = tuple({"model_name": MODEL, **({"engine_type": "unified", "pp_rank": "0", "tp_rank": "0"} if ranks else {}),
                    **s} for s in series)
    keys = ("engine_type", "model_name", "pp_rank", "tp_rank") if ranks else ("model_name",)
    lines = _histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                       {"model_name": series[0]["model_name"]})
    lines += _page(SGLANG_SCHEDULER, list(series), keys)
    lines += _page(SGLANG_TOKENIZER, list(series), ("model_name",))
    return "\n".join(PROCESS + lines) + "\n"


@dataclass(frozen=True)
class Reply:
    """A non-default answer: another status, body, content type, or a delay (seconds) before answering."""

    body: str = ""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    delay_s: float = 0.0


class ReplayServer:
    """Serves ``pages[n]`` to the n-th GET of /metrics (the last one from then on) on 127.0.0.1:0."""

    def __init__(self, pages: list[str | Reply]) -> None:
        self.pages = list(pages)
        self.requests = 0
        self.lock = threading.Lock()
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with outer.lock:
                    n = outer.requests
                    outer.requests += 1
                    outer.headers.append(dict(self.headers))
                page = outer.pages[min(n, len(outer.pages) - 1)] if self.path.split("?")[0] == "/metrics" \
                    else Reply("not found", 404)
                reply = page if isinstance(page, Reply) else Reply(page)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                data = reply.body.encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def __enter__(self) -> "ReplayServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


class SimulatedTime:
    """A monotonic clock that only ``sleep`` advances (wall time: a fixed epoch plus it): observe's loop, run
    with it, polls at exactly 0, interval, 2 x interval, ... of the clock and never waits between polls (a
    fetch still takes its real time: a server's delay and a poll's timeout are real)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1.7e9 + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def simulate_observe_time(monkeypatch: Any) -> None:
    """Make every ``kvplan observe`` run in this test (the CLI builds its Session and calls run with their
    defaults) keep :class:`SimulatedTime`, a new one per Session: the polls a ``--duration`` / ``--interval``
    pair asks for, without sleeping through them."""
    from kvplan.observe import session

    clocks: list[SimulatedTime] = []
    init = session.Session.__init__

    def timed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if "clock" not in kwargs:  # a test's own clock is kept
            clocks.append(SimulatedTime())
            kwargs.update(clock=clocks[-1], wall=clocks[-1].wall)
        init(self, *args, **kwargs)

    def sleep(seconds: float) -> None:
        clocks[-1].sleep(seconds) if clocks else time.sleep(seconds)

    monkeypatch.setattr(session.Session, "__init__", timed_init)
    monkeypatch.setitem(session.run.__kwdefaults__, "sleep", sleep)
