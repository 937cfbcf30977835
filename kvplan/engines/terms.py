"""The budget's terms and the facts an engine model is given: each term with its source (:class:`Term`), the per-GPU
:class:`Budget`, the engine's defaults, the device and the features asked for.
"""

from __future__ import annotations

from kvplan.frozen import frozen


@frozen
class Term:
    """One budget term in bytes and where it came from (``computed: ...`` or ``--weights-gib``)."""

    name: str
    bytes: int
    source: str


# a term the user gave (--weights-gib ...) or a calibration file measured; "--quantization fp8: ..." is an estimate
GIVEN_SOURCES = ("--weights-gib", "--activation-gib", "--overhead-gib", "--cudagraph-gib", "--enforce-eager", "calibration")


def given(term: Term) -> bool:
    """Whether ``term`` was given rather than estimated: an engine adds nothing of its own to it."""
    return term.source.startswith(GIVEN_SOURCES)


@frozen
class Budget:
    """Per-GPU memory budget (bytes).

    ``usable = ceil(total x gpu_util)`` (vLLM >= 0.19; ``floor`` of the float product before, which
    gives the same block count); ``kv_budget = usable - weights - activation - overhead - cudagraph``,
    or the explicit ``--kv-budget`` when given (then the other terms are informational); on a unified-memory
    device less ``host_bytes`` too (the host's use, which no term of the engine's holds).
    ``activation_forward_bytes`` / ``activation_sampler_bytes`` are the decoder's two candidates (both 0
    when the term was given by the user or the engine has none); a multimodal model's dummy image batch adds
    ``activation_images_bytes`` (pixels and cached encoder outputs, alive through both) and its own candidate
    ``activation_encoder_bytes`` (the encoder run): the activation term is
    ``max(max(forward, sampler) + images, encoder)``.
    """

    total_bytes: int
    gpu_util: float
    usable_bytes: int
    weights: Term
    activation: Term
    overhead: Term
    cudagraph: Term
    kv_budget_bytes: int
    kv_budget_source: str
    requested_rounding: str = "ceil"  # how usable was rounded: "ceil" or "floor" (vLLM's float product)
    activation_forward_bytes: int = 0
    activation_sampler_bytes: int = 0
    notes: tuple[str, ...] = ()
    activation_images_bytes: int = 0
    activation_encoder_bytes: int = 0
    path_gap_bytes: int = 0  # how much more the activation is where the engine takes its other code path (vLLM
    # 0.8 - 0.11: the native sampler where FlashInfer is not installed); the low end of the plan's range pays it
    state_pool_bytes: int = 0  # a pool of per-request state slots the engine carves out of the budget before the
    # KV pool (SGLang's Mamba pool: ``state_slots x`` one request's state); ``kv_budget_bytes`` is what is left
    state_slots: int = 0  # that pool's request slots (SGLang's max_mamba_cache_size); 0: no such pool
    host_bytes: int = 0  # on a unified-memory device: what the host's use takes from the free memory the engine
    # measures, which kvplan cannot know (the corpus median, kvplan.planning.budget.with_host_use); kv_budget_bytes is
    # net of it
    unmodelled_bytes: int = 0  # non-torch memory on a platform whose share of it kvplan's formula leaves out (ROCm:
    # hipBLASLt's loaded kernels), the calibration median the overhead term includes
    # (kvplan.planning.budget.with_unmodelled_non_torch); 0 where no calibration log of the class measured it
    first_rank_gap_bytes: int = 0  # how much more KV budget rank 0 has than the pool's fullest rank (vLLM above 2
    # NVLink ranks: the NCCL send buffers rank 0, the first of the chain, does not hold; in the overhead term,
    # kvplan.engines.vllm_overhead.fullest_rank_bytes): a log's "Available KV cache memory" is rank 0's
    nvls_gap_bytes: int = 0  # what vLLM V0's NVLS figure (288 MiB x tp per communicator) would add above NCCL's own
    # sizes, which V1 is planned with (kvplan.engines.vllm_overhead.NVLS_BYTES_PER_RANK): the range's low end pays it
    unlisted_weights_bytes: int = 0  # weights counted from parameters x a dtype on a hybrid or multimodal model: the
    # layers its quantizer keeps in 16 bits, which a 16-bit spec cannot name - the calibration median the weights
    # term includes (kvplan.planning.budget.with_unlisted_weights)
    mm_profile: tuple[int, str, int] | None = None  # the dummy multimodal batch: (items, modality, encoder budget
    # tokens), as vLLM logs it ("Encoder cache will be initialized with a budget of N tokens, and profiled with K
    # image items"); None: no multimodal profile

    @property
    def terms(self) -> tuple[Term, ...]:
        return (self.weights, self.activation, self.overhead, self.cudagraph)


@frozen
class EngineDefaults:
    """Engine settings that change capacity: utilisation, block size, batching limits.

    ``mode``: vLLM's ``V0``/``V1`` engine or ``sglang``. ``usage_context``: ``serve`` (``vllm serve``,
    the OpenAI server) or ``llm`` (the ``LLM`` class), which have different batching defaults.
    ``refusal``: how the engine decides that one request at ``max_model_len`` does not fit:
    ``tokens`` (V0: ``max_model_len > num_blocks x block_size``), ``bytes`` (V1: needed bytes >
    available bytes), ``null_block`` (``num_blocks - 1`` blocks must hold it) or ``pool`` (SGLang:
    the request is capped by the pool instead of refusing to start).
    ``kv_tokens_rule``: how the engine prints its token capacity: ``blocks`` (``num_blocks x
    block_size``) or ``concurrency`` (``int(max_concurrency x max_model_len)``).
    """

    engine: str
    version: str
    gpu_util: float
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    mode: str = ""
    usage_context: str = "serve"
    cudagraph_profiled: bool = False
    refusal: str = "null_block"
    kv_tokens_rule: str = "concurrency"
    notes: tuple[str, ...] = ()
    requested_version: str = ""  # what the user typed (--engine-version), "" for the default
    release_range: str = ""  # the releases whose rules ``version`` models, e.g. "0.18.0 - 0.19.x"
    concurrent_batches: int = 1  # batches in flight at once (2 with vLLM >= 0.26's async scheduling)
    prefix_caching: bool | None = None  # forced by the engine for this model (vLLM's CPU MLA: off); None: not forced
    prefix_caching_default: bool | None = None  # the default for this model where it is not the release's (vLLM's
    # hybrids 0.11.1 - 0.25: off); None: the release's default
    kv_in_model_dtype: bool = False  # the engine keeps this model's KV cache in the model dtype (vLLM's Falcon)
    max_len_rule: str = ""  # how rope scaling sets the model's maximum length (vLLM's Profile.max_len_rule)
    mla_align_bytes: int = 0  # MLA cache entries padded to this many bytes of the model dtype (vLLM V0 0.7.2+)
    pool_follows_length: bool = False  # the budget depends on max_model_len (vLLM V0's batch, a dummy video's frames)
    long_prefill_chunked: bool = True  # vLLM V0 chunks prefills above 32K by itself (not on ROCm, nor for
    # multimodal or sliding-window models)
    chunked_prefill_switch: bool | None = None  # the user's --[no-]enable-chunked-prefill (vLLM); None: not given
    state_pool: bool = False  # state layers live in a pool of request slots of their own, outside the token pool
    # (SGLang's MambaPool): the pool layout holds the attention layers only
    state_slots: int = 0  # that pool's request slots once the budget is split (SGLang's max_mamba_cache_size)
    state_slots_per_request: int = 1  # slots the request cap counts per running request (SGLang: 3 with radix cache)
    windows_full_length: bool = False  # sliding / chunked layers hold every token (SGLang outside its hybrid SWA pool)
    swa_ratio: float = 0.0  # > 0: sliding layers in a pool of their own with this ratio of the full pool's tokens
    # (SGLang's hybrid SWA pool, --swa-full-tokens-ratio); the plan's layout is then memory.split_swa_layout
    charges_other_processes: bool = False  # the profiler charges memory other processes hold on the GPU as this
    # engine's non-torch memory (vLLM V0 0.6.4 and V1 0.8.0 - 0.9.0; SGLang, which sizes the pool from the free
    # memory before loading: a desktop on the card shrinks the KV budget)
    pp_partition: str = "before-last"  # how get_pp_indices places the remainder layers (kvplan.memory.stages.PARTITIONS)
    pp_free_min: bool = False  # every pipeline stage's pool is sized from the smallest free memory over all ranks
    # (SGLang's get_available_gpu_memory(distributed=True) over the world group), not from its own
    pool_shards: int = 1  # the pool is split into this many parts, each with its own scheduler (vLLM V0 at pp >= 2:
    # one virtual engine per stage, num_gpu_blocks // pp blocks each, vllm/core/scheduler.py)

    @property
    def label(self) -> str:
        """``vllm 0.19.0`` (the version asked for) or ``vllm 0.30.0 and later`` (the modelled range)."""
        return f"{self.engine} {self.requested_version or self.release_range or self.version}"


@frozen
class Device:
    """What an engine's budget needs to know about the GPU beyond its memory.

    ``platform``: ``cuda`` or ``rocm``. ``sm_count``: streaming multiprocessors (AMD: compute units),
    ``None`` when unknown. ``interconnect``: ``nvlink-switch``, ``nvlink``, ``pcie``, ``infinity-fabric``
    or ``None`` (the GPU catalogue's field).
    """

    platform: str = "cuda"
    sm_count: int | None = None
    interconnect: str | None = None
    compute_capability: str | None = None  # "9.0" (NVIDIA), None when unknown or not NVIDIA
    smi_memory_bytes: int | None = None  # the total nvidia-smi shows (SGLang's defaults read it); None: unknown

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability as ``(major, minor)``, None when unknown."""
        try:
            major, minor = str(self.compute_capability).split(".")
            return int(major), int(minor)
        except ValueError:
            return None


@frozen
class Features:
    """Serving features that change the budget, as the engine's flags set them.

    ``max_loras``: adapters whose weight slots the engine keeps (vLLM ``--max-loras``; 0: LoRA off);
    ``max_lora_rank``: the rank each slot is sized for. ``speculative``: the speculative decoding method
    (``mtp``, ``eagle``, ``eagle3``, ``ngram``; None: off) and ``speculative_tokens`` the tokens it proposes
    per step. ``expert_parallel``: experts split over the GPUs instead of their intermediate size
    (vLLM ``--enable-expert-parallel``). ``flashinfer``: whether FlashInfer is installed, which decides the
    sampler path of vLLM 0.8 - 0.11's profile run (None: not known; kvplan plans the Docker images' FlashInfer).
    ``fp8_weights``: the weights run in fp8 (an fp8 checkpoint or online fp8), so the fused-MoE kernels quantize
    their inputs to fp8 too (:func:`~kvplan.engines.forward.moe_quantized_input_bytes`).
    """

    max_loras: int = 0
    max_lora_rank: int = 16
    speculative: str | None = None
    speculative_tokens: int = 0
    expert_parallel: bool = False
    flashinfer: bool | None = None  # FlashInfer installed (vLLM 0.8 - 0.11's sampler path); None: not known
    fp8_weights: bool = False  # the weights run in fp8 (w8a8 kernels: the MoE experts quantize their inputs)

    @property
    def lora(self) -> bool:
        return self.max_loras > 0
