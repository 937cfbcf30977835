"""The engines' metric names, and one Prometheus text page -> one reading per series.

What kvplan reads (``FIELDS``), each from the first name of its engine's list that the page has (newer
names first; the names and the releases that use them are in docs/observe.md, from the engines' own
metric definitions):

- ``usage``: fraction of the KV pool in use, 0..1 (vLLM: used blocks / ``num_gpu_blocks``; SGLang:
  used tokens / ``max_total_num_tokens``);
- ``running`` / ``waiting``: requests in the running batch / in the queue (gauges);
- ``preemptions``: requests preempted so far (counter; SGLang calls them retractions);
- ``prefix_queries`` / ``prefix_hits``: prefix-cache lookups and hits in tokens (counters, vLLM V1), or
  ``prefix_hit_rate``: a hit-rate gauge 0..1 (vLLM V0, SGLang);
- ``prompt_tokens`` / ``generation_tokens``: tokens processed so far (counters);
- ``max_total_tokens``: SGLang's pool size in tokens (gauge);
- vLLM's ``vllm:cache_config_info`` (a gauge fixed at 1 whose labels are the engine's cache config:
  ``block_size``, ``num_gpu_blocks``, ``gpu_memory_utilization``, ...) gives ``num_gpu_blocks`` and
  ``block_size``, and the config the plan comparison may read.

Values a server can send but kvplan cannot use (:func:`checked`): NaN and infinities (a gauge with nothing
to report sends NaN), a negative count, a fraction outside 0..1, a count past 2**53, prefix hits above the
queries of the same page. Each is left out of that poll and named in ``SeriesReading.rejected``; vLLM V0's
hit-rate gauge at -1 means its prefix caching is off (no hit rate, not a bad value).

A series is one set of labels (``model_name``, vLLM V1's ``engine`` index, SGLang's ranks): several
models or engines behind one endpoint are kept apart. Samples whose labels are a subset of a series'
labels (``vllm:cache_config_info`` carries only ``engine``, SGLang's tokenizer counters only
``model_name``) are folded into every such series of the same engine.
"""

from __future__ import annotations

from dataclasses import field
from typing import Callable, Mapping

from kvplan.errors import InputError, KvplanError
from kvplan.units import check_number
from kvplan.frozen import frozen

FIELDS = ("usage", "running", "waiting", "preemptions", "prefix_queries", "prefix_hits", "prefix_hit_rate",
          "prompt_tokens", "generation_tokens", "max_total_tokens")
# what a step-time fit reads besides (``observe --fit-timing``, vLLM V1): engine steps, first tokens, and the
# finished requests' prompt and generated tokens (histogram sums and counts). Never named as missing: a
# server without them still has every figure above.
TIMING_FIELDS = ("steps", "first_tokens", "finished_requests", "finished_prompt_tokens", "finished_generation_tokens")
COUNTERS = frozenset({"preemptions", "prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens",
                      *TIMING_FIELDS})
GAUGES = ("usage", "running", "waiting", "prefix_hit_rate", "max_total_tokens")

COUNT_MAX = 2**53  # past this a float no longer holds whole numbers, and no server counts that far
# field -> (lowest, highest) value a server can mean: fractions 0..1, counts 0..COUNT_MAX (checked by check_number)
RANGES: dict[str, tuple[float, float]] = {
    "usage": (0.0, 1.0), "prefix_hit_rate": (0.0, 1.0),
    **{fld: (0, COUNT_MAX) for fld in ("running", "waiting", "preemptions", "prefix_queries", "prefix_hits",
                                       "prompt_tokens", "generation_tokens", "max_total_tokens", *TIMING_FIELDS)},
}

# field -> exposition names, preferred first. Counters carry their exposed ``_total`` suffix.
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_hit_rate": ("vllm:gpu_prefix_cache_hit_rate",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "steps": ("vllm:iteration_tokens_total_count",),  # one observation per engine step
    "first_tokens": ("vllm:time_to_first_token_seconds_count",),
    "finished_requests": ("vllm:request_prompt_tokens_count",),
    "finished_prompt_tokens": ("vllm:request_prompt_tokens_sum",),
    "finished_generation_tokens": ("vllm:request_generation_tokens_sum",),
}
SGLANG_NAMES: dict[str, tuple[str, ...]] = {
    "usage": ("sglang:token_usage",),
    "running": ("sglang:num_running_reqs",),
    "waiting": ("sglang:num_queue_reqs",),
    "preemptions": ("sglang:num_retracted_requests_total",),
    "prefix_hit_rate": ("sglang:cache_hit_rate",),
    "prompt_tokens": ("sglang:prompt_tokens_total",),
    "generation_tokens": ("sglang:generation_tokens_total",),
    "max_total_tokens": ("sglang:max_total_num_tokens",),
}
VLLM_CACHE_CONFIG = "vllm:cache_config_info"
# names only one generation of vLLM exposes (to tell V1 from V0 in the output)
_V1_ONLY = frozenset({"vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"})
_V0_ONLY = frozenset({"vllm:gpu_prefix_cache_hit_rate", "vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc"})

Labels = tuple[tuple[str, str], ...]


def _vllm_generation(labels: Labels, seen: set[str]) -> str:
    """Which vLLM engine the page's names (or V1's ``engine`` label) reveal."""
    if seen & _V1_ONLY or "engine" in dict(labels):
        return "vLLM V1"
    if seen & _V0_ONLY:
        return "vLLM V0"
    return "vLLM"


@frozen
class Family:
    """One engine's metric vocabulary, keyed by kvplan's engine name (``--engine``): the names per field,
    the info metric holding its cache config (if any), how it sizes its pool (``blocks`` from the cache
    config, or ``tokens`` from ``max_total_tokens``), and how to name the engine a page shows."""

    label: str
    names: Mapping[str, tuple[str, ...]]
    cache_config: str | None
    pool_unit: str
    generation: Callable[[Labels, set[str]], str] | None = None

    def engine(self, labels: Labels, seen: set[str]) -> str:
        return self.generation(labels, seen) if self.generation else self.label


FAMILIES = {
    "vllm": Family("vLLM", VLLM_NAMES, VLLM_CACHE_CONFIG, "blocks", _vllm_generation),
    "sglang": Family("SGLang", SGLANG_NAMES, None, "tokens"),
}
NAMES = {name: family.names for name, family in FAMILIES.items()}

# name -> (engine family, field, preference index)
_LOOKUP: dict[str, tuple[str, str, int]] = {
    name: (family, fld, i) for family, table in NAMES.items() for fld, names in table.items() for i, name in enumerate(names)
}


class PageError(KvplanError):
    """A page that is not a Prometheus text page, or holds no vLLM / SGLang metric."""


@frozen
class SeriesReading:
    """One series on one page: its labels, engine, the values read and the metric name of each.

    ``values``: field -> value (fractions 0..1, requests, tokens). ``cache_config``: the labels of
    ``vllm:cache_config_info`` for this series (empty for SGLang or when absent). ``rejected``: field -> why
    the page's value was left out (:func:`checked`).
    """

    family: str  # a key of FAMILIES (kvplan's engine name)
    labels: Labels
    engine: str  # "vLLM V1", "vLLM V0", "vLLM" (cannot tell), "SGLang"
    values: Mapping[str, float]
    names: Mapping[str, str]
    cache_config: Mapping[str, str] = field(default_factory=dict)
    rejected: Mapping[str, str] = field(default_factory=dict)
    timing: Mapping[str, float] = field(default_factory=dict)  # TIMING_FIELDS the page has (a value no server means: left out)

    @property
    def key(self) -> tuple[str, Labels]:
        return (self.family, self.labels)

    @property
    def name(self) -> str:
        return series_name(self.labels)

    @property
    def num_gpu_blocks(self) -> int | None:
        return _int_label(self.cache_config.get("num_gpu_blocks"))

    @property
    def block_size(self) -> int | None:
        return _int_label(self.cache_config.get("block_size"))

    def missing(self) -> tuple[str, ...]:
        """What this engine documents but the page lacks, as ``field (name, ...)`` phrases."""
        table = NAMES[self.family]
        read = {*self.values, *self.rejected}  # a rejected value was there: it is named as such, not as missing
        out = []
        for fld, names in table.items():
            if fld in read or fld in TIMING_FIELDS:  # timing counters: read apart (SeriesReading.timing)
                continue
            if fld in ("prefix_queries", "prefix_hits") and "prefix_hit_rate" in read:
                continue
            if fld == "prefix_hit_rate" and {"prefix_queries", "prefix_hits"} <= read:
                continue
            out.append(f"{fld} ({', '.join(names)})")
        config = FAMILIES[self.family].cache_config
        if config and self.num_gpu_blocks is None:
            out.append(f"num_gpu_blocks ({config})")
        return tuple(out)


@frozen
class Page:
    """Every series one page holds, in the page's order; ``other_families``: metric families not read."""

    series: tuple[SeriesReading, ...]
    other_families: int = 0


def series_name(labels: Labels) -> str:
    """``model_name`` first, then the other labels as ``k=v``; ``(no labels)`` when there are none."""
    d = dict(labels)
    parts = [d.pop("model_name")] if "model_name" in d else []
    parts += [f"{k}={v}" for k, v in sorted(d.items())]
    return " ".join(parts) or "(no labels)"


def _int_label(text: str | None) -> int | None:
    """A whole-number label (``num_gpu_blocks="27732"``), or None for ``None``, garbage, NaN, out of range."""
    if text is None:
        return None
    try:
        value = check_number(float(text), "label", low=0, high=COUNT_MAX)
    except (ValueError, InputError):
        return None
    return int(value) if value.is_integer() else None


def checked(values: Mapping[str, float], names: Mapping[str, str]) -> tuple[dict[str, float], dict[str, str]]:
    """The page's values kvplan can use, and field -> why each other one is left out (one line, naming the
    metric and its value). Ranges in :data:`RANGES`, checked by :func:`kvplan.units.check_number`."""
    kept: dict[str, float] = {}
    rejected: dict[str, str] = {}
    for fld, value in values.items():
        if fld == "prefix_hit_rate" and value == -1:  # vLLM V0: "-1 means not supported or disabled"
            rejected[fld] = f"{names[fld]} is -1: prefix caching is off on the server, so there is no hit rate"
            continue
        low, high = RANGES[fld]
        try:
            kept[fld] = check_number(value, names[fld], low=low, high=high)
        except InputError as exc:
            rejected[fld] = exc.message
    hits, queries = kept.get("prefix_hits"), kept.get("prefix_queries")
    if hits is not None and queries is not None and hits > queries:
        rejected["prefix_hits"] = (f"invalid {names['prefix_hits']} {hits!r}: more hits than "
                                   f"{names['prefix_queries']} {queries!r}")
        del kept["prefix_hits"]
    return kept, rejected


def parse_page(text: str) -> Page:
    """The readings of one ``/metrics`` page; raises :class:`PageError` for a page kvplan cannot use."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # noqa: BLE001 - the parser's error types are not documented (ValueError mostly)
        detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise PageError(f"not a Prometheus text page ({detail})") from None
    found: dict[tuple[str, Labels], dict[str, tuple[int, float, str]]] = {}
    configs: dict[Labels, dict[str, str]] = {}
    seen: set[str] = set()
    other = 0
    for family in families:
        used = False
        for sample in family.samples:
            seen.add(sample.name)
            if sample.name == VLLM_CACHE_CONFIG:
                engine = sample.labels.get("engine")
                configs[(("engine", engine),) if engine is not None else ()] = dict(sample.labels)
                used = True
                continue
            hit = _LOOKUP.get(sample.name)
            if hit is None:
                continue
            fam, fld, rank = hit
            slot = found.setdefault((fam, tuple(sorted(sample.labels.items()))), {})
            if fld not in slot or rank <= slot[fld][0]:
                slot[fld] = (rank, float(sample.value), sample.name)
            used = True
        other += not used
    if not found:
        raise PageError(f"no vLLM or SGLang metric on the page ({len(families)} other metric families)",
                        "point at the engine's own /metrics (SGLang needs --enable-metrics)")
    return Page(_series(found, configs, seen), other)


def _series(found: dict[tuple[str, Labels], dict[str, tuple[int, float, str]]],
            configs: dict[Labels, dict[str, str]], seen: set[str]) -> tuple[SeriesReading, ...]:
    """Fold partial label sets (no pool gauge) into the full series whose labels include theirs."""
    pool = {"usage", "running", "waiting"}
    full = [k for k, v in found.items() if pool & set(v)] or list(found)
    merged = {k: dict(found[k]) for k in full}
    for key, slot in found.items():
        if key in merged:
            continue
        for target in full:
            if target[0] == key[0] and set(key[1]) <= set(target[1]):
                for fld, entry in slot.items():
                    merged[target].setdefault(fld, entry)
    out = []
    for (fam, labels), slot in merged.items():
        config: dict[str, str] = {}
        if FAMILIES[fam].cache_config:
            for cfg_labels, cfg in configs.items():
                if set(cfg_labels) <= set(labels):
                    config = cfg
                    break
        names = {fld: entry[2] for fld, entry in slot.items() if fld not in TIMING_FIELDS}
        values, rejected = checked({fld: e[1] for fld, e in slot.items() if fld in names}, names)
        timing, _ = checked({fld: e[1] for fld, e in slot.items() if fld in TIMING_FIELDS},
                            {fld: e[2] for fld, e in slot.items()})
        out.append(SeriesReading(fam, labels, FAMILIES[fam].engine(labels, seen), values, names, config, rejected,
                                 timing))
    return tuple(out)
