"""SGLang's Mamba / linear-attention hybrids (Qwen3-Next, Qwen3.5, Nemotron-H, Falcon-H1, ...): the state pool of
request slots carved out of the budget before the KV pool, release by release.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvplan import memory
from kvplan.engines import Budget, EngineDefaults
from kvplan.engines.sglang_releases import release
from kvplan.model.spec import LayerCache
from kvplan.units import GiB, MiB, parse_dtype, plural

MAMBA_FULL_MEMORY_RATIO = 0.9  # --mamba-full-memory-ratio: the state pool's bytes per KV pool byte (0.5.4+)
MAMBA_FIXED_SLOTS = 512  # the state pool's slots without the ratio (0.5.2 - 0.5.3; radix cache off in 0.5.4 - 0.5.9)
MAMBA_SLOTS_PER_RUNNING_REQUEST = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (radix cache on, no extra buffer)
MAMBA_CONV_DTYPE = "bfloat16"  # the conv state's dtype in every release (SGLANG_MAMBA_CONV_DTYPE unset)
MAMBA_SSM_DTYPE = "float32"  # --mamba-ssm-dtype's default


def mamba_cache_per_req(layers: tuple[LayerCache, ...]) -> int:
    """Bytes of one request's state slot (``mamba_cache_per_req``, configs/mamba_utils.py): over this GPU's state
    layers, the conv state in bfloat16 (:data:`MAMBA_CONV_DTYPE`) + the SSM (temporal) state in the layer's SSM dtype
    (the engine's, :func:`kvplan.engines.sglang.ssm_dtype`). Qwen3.5-9B at tp 2: 24 layers x (12,288 x 2 + 262,144 x 4) = 25,755,648 B."""
    return memory.state_bytes_per_request(layers, parse_dtype(MAMBA_CONV_DTYPE))


def mamba_radix_cache(version: str, state_kinds: set[str] | frozenset[str]) -> bool | None:
    """Whether the release forces the radix cache off for a hybrid of these state kinds (``False``), else None:
    0.5.2 - 0.5.3 for every hybrid ("Hybrid GDN model detected, disable radix cache"), 0.5.4 - 0.5.9 for Mamba2
    models (``mamba2_config``: Nemotron-H, Falcon-H1)."""
    r = release(version)
    if r.mamba == "fixed" or (r.mamba2_radix_off and "mamba2" in state_kinds):
        return False
    return None


def mamba_slots(version: str, rest_bytes: int, per_req_bytes: int, *, radix_cache: bool,
                max_running_requests: int | None = None) -> tuple[int, str]:
    """``(max_mamba_cache_size, how)``: the state pool's request slots out of ``rest_bytes``, the pool's budget
    (bytes, what ``profile_max_num_token`` keeps: free after loading - free before x (1 - mem_fraction_static)),
    ``per_req_bytes`` one slot (:func:`mamba_cache_per_req`). The state pool then takes ``slots x per_req_bytes``
    and the KV pool the rest (``max_total_num_tokens = (rest - slots x per_req) // cell_size``, the cell of the
    full-attention layers only).

    - 0.5.2 - 0.5.3 (``ModelRunner.__init__``, ``profile_max_num_token``): ``--max-running-requests``, else 512;
    - 0.5.4 - 0.5.9 (``ModelRunner.handle_max_mamba_cache``): with the radix cache off (``--disable-radix-cache``,
      or forced for Mamba2 models) the same; else the ratio: ``int(rest x r / (1 + r) // per_req)``, ``r =
      mamba_full_memory_ratio`` 0.9 (47% of the budget to state; 0.5.4 / 0.5.5 also ``// (1 + speculative draft
      tokens)``, speculative decoding is not modelled);
    - 0.5.10+ (``model_runner_kv_cache_mixin.handle_max_mamba_cache``; 0.5.16+ ``kv_cache_configurator``):
      ``--max-running-requests`` only with the radix cache off, else the ratio.
    ``--max-mamba-cache-size`` (not a kvplan option) would fix it in 0.5.10+.
    """
    r = release(version)
    if r.mamba == "fixed" or (not radix_cache and (r.mamba2_radix_off or max_running_requests)):
        if max_running_requests:
            return max_running_requests, f"--max-running-requests {max_running_requests}"
        return MAMBA_FIXED_SLOTS, f"{MAMBA_FIXED_SLOTS} (the default without --max-running-requests)"
    rest_gib = rest_bytes / GiB  # SGLang's float GiB
    raw = rest_gib * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
    slots = max(0, int(raw * GiB // per_req_bytes)) if per_req_bytes > 0 else 0
    return slots, (f"mamba_full_memory_ratio {MAMBA_FULL_MEMORY_RATIO:g}: {rest_gib:.2f} GiB x "
                   f"{MAMBA_FULL_MEMORY_RATIO:g}/{1 + MAMBA_FULL_MEMORY_RATIO:g} // {per_req_bytes:,} B")


def mamba_slots_per_request(version: str, radix_cache: bool) -> int:
    """State slots the request cap counts per running request: ``max_running_requests <= max_mamba_cache_size //
    ratio`` (0.5.4+ ``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``): 3 with the radix cache (no extra buffer, the
    default ``--mamba-scheduler-strategy``), 1 without; 0.5.2 - 0.5.3 cap at the slots themselves (1)."""
    return MAMBA_SLOTS_PER_RUNNING_REQUEST if radix_cache and release(version).mamba == "ratio" else 1


def split_state_pool(engine: EngineDefaults, budget: Budget, layers: tuple[LayerCache, ...], *,
                     max_num_seqs: int | None, prefix_caching: bool) -> tuple[EngineDefaults, Budget]:
    """SGLang's split of a hybrid's budget (bytes) into the Mamba state pool and the KV pool (:func:`mamba_slots`):
    the budget's ``kv_budget_bytes`` becomes the KV pool's (``rest - slots x per_req``), ``state_pool_bytes`` /
    ``state_slots`` the state pool's, and the defaults carry the slots for the request cap
    (:func:`kvplan.engines.sglang.request_limit`). A given KV budget (``--kv-budget``, like ``--max-total-tokens``) is the KV pool's; the
    state pool is then taken as ``mamba_full_memory_ratio`` x it."""
    per_req = mamba_cache_per_req(layers)
    given = budget.kv_budget_source.startswith("--kv-budget")
    rest = budget.kv_budget_bytes
    if given:
        rest = budget.kv_budget_bytes + math.floor(budget.kv_budget_bytes * MAMBA_FULL_MEMORY_RATIO)
    slots, how = mamba_slots(engine.version, max(0, rest), per_req, radix_cache=prefix_caching,
                             max_running_requests=max_num_seqs)
    if given:
        how = f"--kv-budget is the KV pool, the state pool taken as {MAMBA_FULL_MEMORY_RATIO:g} x it: {how}"
    state = slots * per_req
    per_request = mamba_slots_per_request(engine.version, prefix_caching)
    kv = budget.kv_budget_bytes if given else rest - state
    cap = (f"running requests capped at {slots:,} // {per_request} = {slots // per_request:,}"
           + (" (radix cache on)" if per_request > 1 else ""))
    note = (f"sglang splits the budget into a Mamba state pool of {plural(slots, 'request slot')} ({how}; "
            f"{per_req / MiB:,.2f} MiB each, {state / GiB:.2f} GiB) and a KV pool of the full-attention layers "
            f"({kv / GiB:.2f} GiB); {cap}")
    source = budget.kv_budget_source + f" - the Mamba state pool ({slots:,} x {per_req:,} B)" if not given else \
        budget.kv_budget_source
    return (replace(engine, state_slots=slots, state_slots_per_request=per_request),
            replace(budget, kv_budget_bytes=kv, kv_budget_source=source, state_pool_bytes=state, state_slots=slots,
                    notes=budget.notes + (note,)))
