"""SGLang's modelled releases: what each range of releases does when it sizes the pool (Release), and any PEP 440
version resolved to one of them.
"""

from __future__ import annotations


from kvplan.engines import release_ranges, release_tuple, resolve_release
from kvplan.frozen import frozen

ENGINE = "sglang"


@frozen
class Release:
    """What the SGLang releases from ``first`` up to the next one do when they size the pool.

    ``fraction``: the ``mem_fraction_static`` rule (``ladder-0.3``, ``ladder``, ``ladder-13g``, ``ladder-big``,
    ``tiers``, ``estimate``); ``tiers``: the (chunked_prefill_size, cuda_graph_max_bs) table by GPU memory
    (``small-25000``, ``small-tp``, ``0.4.8``, ``0.5.3``, ``0.5.5``, ``0.5.20``); ``graph_reserve``: the 0.5.10+
    piecewise CUDA-graph reserve; ``page_rounding``: the pool rounded down to whole pages (0.4.6+);
    ``clamp_plus_one``: ``max_running_requests``' clamp is one higher (the request pool's padding slot,
    0.3 - 0.4.6) (sliding-window pools, per architecture and release: :func:`hybrid_swa`). Mamba / linear-attention
    hybrids (:func:`mamba_slots`): ``mamba`` how the state pool's request slots are sized (``fixed``: 512 or
    ``--max-running-requests``, radix cache off, 0.5.2 - 0.5.3; ``ratio``: ``mamba_full_memory_ratio`` of the
    budget, 0.5.4+); ``mamba2_radix_off``: Mamba2 models run without the radix cache (0.5.4 - 0.5.9);
    ``ssm_from_config``: the SSM state dtype is the config's ``mamba_ssm_dtype`` when it names one (0.5.10+; before,
    ``--mamba-ssm-dtype``'s float32). ``min_on_nccl``: at tp >= 2 the minimum over ranks of the free memory is
    all-reduced on the default (NCCL) process group, whose communicator NCCL creates by that first collective, after
    this rank read its free memory (``get_available_gpu_memory(distributed=True)``: a CUDA tensor, 0.3 - 0.4.6; 0.4.7+
    reduce on the gloo ``cpu_group``): the pool pays that communicator in full (:func:`~kvplan.engines.sglang.late_comm_bytes`).
    ``pp_partition``: where ``get_pp_indices`` puts the remainder layers (``last``: all on the last stage, before 0.5.6;
    ``last-each``: one each to the last stages, 0.5.6+; :data:`kvplan.memory.stages.PARTITIONS`).
    """

    version: str
    first: tuple[int, int, int]
    change: str
    fraction: str
    tiers: str
    graph_reserve: bool = False
    page_rounding: bool = True
    clamp_plus_one: bool = False
    mamba: str = "ratio"
    mamba2_radix_off: bool = False
    ssm_from_config: bool = True
    min_on_nccl: bool = False
    pp_partition: str = "last-each"


_OLD_MAMBA = dict(mamba="fixed", ssm_from_config=False, pp_partition="last")  # 0.5.2 - 0.5.3's state pool (older releases serve no hybrid)
RELEASES: dict[str, Release] = {r.version: r for r in (
    Release("0.3", (0, 3, 0), "tp ladder 0.88 - 0.79 (0.82 at tp 8)", "ladder-0.3", "small-25000",
            page_rounding=False, clamp_plus_one=True, min_on_nccl=True, **_OLD_MAMBA),
    Release("0.4", (0, 4, 0), "tp ladder 0.88 / 0.87 / 0.85 / 0.81 / 0.79", "ladder", "small-tp",
            page_rounding=False, clamp_plus_one=True, min_on_nccl=True, **_OLD_MAMBA),
    Release("0.4.6", (0, 4, 6), "above 80 GiB: (gpu - 13 GiB) / gpu; page size", "ladder-13g", "small-tp",
            clamp_plus_one=True, min_on_nccl=True, **_OLD_MAMBA),
    Release("0.4.7", (0, 4, 7), "ladder by tp x pp; a reserve above 96 GiB", "ladder-big", "small-tp",
            **_OLD_MAMBA),
    Release("0.4.8", (0, 4, 8), "a reserve by GPU size: round((gpu - reserved) / gpu, 3); sliding-window pools "
            "from 0.4.10; 0.5.2: a state pool of 512 slots for linear-attention hybrids", "tiers", "0.4.8",
            **_OLD_MAMBA),
    Release("0.5.3", (0, 5, 3), "the reserve estimates activations and CUDA graphs (_handle_gpu_memory_settings)",
            "estimate", "0.5.3", **_OLD_MAMBA),
    Release("0.5.4", (0, 5, 4), "hybrids' state pool: mamba_full_memory_ratio 0.9 of the KV pool "
            "(handle_max_mamba_cache)", "estimate", "0.5.3", mamba2_radix_off=True, ssm_from_config=False,
            pp_partition="last"),
    Release("0.5.5", (0, 5, 5), "cuda_graph_max_bs 24 on 20 - 35 GiB GPUs", "estimate", "0.5.5",
            mamba2_radix_off=True, ssm_from_config=False, pp_partition="last"),
    Release("0.5.6", (0, 5, 6), "pipeline stages: the remainder layers one each to the last stages (get_pp_indices; "
            "before, all on the last)", "estimate", "0.5.5", mamba2_radix_off=True, ssm_from_config=False),
    Release("0.5.10", (0, 5, 10), "a piecewise CUDA-graph reserve", "estimate", "0.5.5", graph_reserve=True),
    Release("0.5.14", (0, 5, 14), "no speculative-decoding reserve (the draft is inside the pool)", "estimate",
            "0.5.5", graph_reserve=True),
    Release("0.5.20", (0, 5, 20), "20 - 35 GiB GPUs: chunked_prefill_size 4096, cuda_graph_max_bs 48 / 160",
            "estimate", "0.5.20", graph_reserve=True),
)}
FIRSTS: dict[str, tuple[int, ...]] = {k: r.first for k, r in RELEASES.items()}
VERSIONS = tuple(RELEASES)
DEFAULT_VERSION = VERSIONS[-1]
NEWEST_CHECKED = (0, 5, 23)  # the newest release whose source was read (sglang 0.5.23)
RANGES = release_ranges(FIRSTS)


def resolve_version(text: str | None) -> tuple[str, str]:
    """``(modelled version, note)`` for any PEP 440 SGLang version (``0.4.6.post1``, ``0.5.3rc0``);
    ``None`` is the newest modelled one. Versions before 0.3 are refused, with the ranges."""
    if text is None:
        return DEFAULT_VERSION, ""
    key, note = resolve_release(ENGINE, text, FIRSTS)
    if release_tuple(text, ENGINE) > NEWEST_CHECKED:
        note += f"; newer than the newest release checked ({'.'.join(map(str, NEWEST_CHECKED))})"
    return key, note


def release(version: str) -> Release:
    """The modelled release for ``version``: a key of :data:`RELEASES` or any version it covers."""
    return RELEASES[version] if version in RELEASES else RELEASES[resolve_version(version)[0]]
