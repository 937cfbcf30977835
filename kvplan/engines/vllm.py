"""vLLM's KV budget, release by release: defaults and the terms its memory profiler subtracts.

``requested = total x gpu_memory_utilization`` (floored float product up to 0.18, ``ceil`` from 0.19);
``available KV = requested - weights - activation peak of the profile run - non-torch increase -
CUDA-graph estimate`` (the last one only from 0.21, where it is profiled and subtracted by default).
Each modelled release is a :class:`Profile`; docs/engines.md gives the sources and the agreement
with 50 real start-up reports (benchmarks/engine_agreement.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.engines import (USAGE_CONTEXTS, Budget, EngineDefaults, Term, forward_bytes_per_token, padded_vocab,
                            sampler_bytes)
from kvplan.errors import InputError
from kvplan.spec import LayerKind, ModelSpec
from kvplan.units import GiB, MiB

ENGINE = "vllm"


@dataclass(frozen=True)
class Profile:
    """What one modelled vLLM release does when it sizes the KV cache.

    ``rounding``: ``floor`` (``requested = total * util`` as a float; blocks floor the difference) or
    ``ceil`` (``math.ceil(total * util)``). ``batch_rule``: which default table fills
    ``max_num_batched_tokens`` / ``max_num_seqs`` (``v0``, ``v1``, ``v1-160``). ``sampler_copies``:
    fp32 ``[rows, vocab]`` tensors alive at the profiled sampler's peak. ``cudagraph``: ``none``
    (captured after the KV cache, out of the ``1 - util`` slack), ``logged`` (estimated, not
    subtracted) or ``subtracted``. ``non_torch_bytes``: the non-torch increase during profiling.
    """

    version: str
    releases: str
    mode: str
    gpu_util: float
    rounding: str
    batch_rule: str
    sampler_copies: int
    cudagraph: str
    refusal: str
    kv_tokens_rule: str
    non_torch_bytes: int
    gpu_util_verified: bool = True


# Non-torch increase (NCCL / cuBLAS / attention workspaces created after the baseline snapshot).
# Logged values (engine_reports.yaml), one per machine: 0.10 (A100-40GB), 0.35 (RTX 3090), 1.79 (H100)
# at tp 1; 0.25, 0.20 (24 GB cards), 3.58 (H100) at tp 2. kvplan uses their median, 0.30 GiB.
NON_TORCH_BYTES = round(0.30 * GiB)

PROFILES: dict[str, Profile] = {
    "0.6": Profile("0.6", "0.6.5 - 0.7.x, V0 engine (memory_profiling of PR #10511)", "V0", 0.9, "floor", "v0",
                   10, "none", "tokens", "blocks", NON_TORCH_BYTES),
    # 0.10: 2 sampler copies, calibrated on four 0.10.1.1 logs that say "Using FlashInfer for top-p & top-k
    # sampling" (no torch sort): Qwen2-7B on an A100 80GB at util 0.25 / 0.5 (tp 1) and tp 2, gpt-oss-120b tp 4.
    # Their activation + non-torch (0.47, 0.50, 0.59, 0.78 GiB) leaves 0.17 - 0.48 GiB for the activation
    # after kvplan's 0.30 GiB non-torch: <= 2 copies of 256 x vocab x 4 B (Qwen2: 0.145 GiB; gpt-oss: 0.19 GiB).
    # docs/engines.md ("Calibration") has the arithmetic.
    "0.10": Profile("0.10", "0.8 - 0.10, V1 engine", "V1", 0.9, "floor", "v1", 2, "none", "bytes", "blocks",
                    NON_TORCH_BYTES),
    # 0.11: 10 sampler copies (the native top-k/top-p path, as V0), calibrated on two independent sources: five
    # H100 logs of vllm/vllm-openai (0.11+ DEBUG line) print the activation peak at 1,024 rows as 9.6 - 9.9 copies
    # of rows x vocab x 4 B (Llama-3.1-8B 4.76 GiB, gpt-oss-20b 7.38, Qwen3-32B 5.64 at tp 1 and 2, Llama-3.3-70B
    # tp 2 4.84); vLLM 0.11.1 on ROCm (R1-Distill-Qwen-14B, tp 2) leaves 6.71 GiB for activation + non-torch,
    # ~10 copies of 1,024 x 152,064 x 4 B. The 0.19+ profiles keep 5 (one 0.19 log). docs/engines.md, Calibration.
    "0.11": Profile("0.11", "0.11 - 0.18, V1 engine (hybrid-aware token report)", "V1", 0.9, "floor", "v1", 10, "none",
                    "bytes", "concurrency", NON_TORCH_BYTES),
    "0.19": Profile("0.19", "0.19 - 0.20, V1: ceil(total x util); CUDA-graph estimate logged, not subtracted", "V1",
                    0.9, "ceil", "v1", 5, "logged", "bytes", "concurrency", NON_TORCH_BYTES),
    "0.21": Profile("0.21", "0.21 - 0.31, V1: CUDA-graph estimate subtracted by default", "V1", 0.92, "ceil", "v1", 5,
                    "subtracted", "null_block", "concurrency", NON_TORCH_BYTES, gpu_util_verified=False),
    "0.32": Profile("0.32", "0.32 and later (2026): >= 160 GiB batch tier (PR #51726)", "V1", 0.92, "ceil", "v1-160", 5,
                    "subtracted", "null_block", "concurrency", NON_TORCH_BYTES),
}
VERSIONS = tuple(PROFILES)
DEFAULT_VERSION = "0.32"

CPU_BLOCK_SIZE = 128
CPU_MAX_NUM_BATCHED_TOKENS = 4096
CPU_KVCACHE_SPACE_BYTES = 4 * GiB  # VLLM_CPU_KVCACHE_SPACE unset: vLLM's CPU backend uses 4 GiB
V0_CHUNKED_PREFILL_TOKENS = 2048  # V0 `vllm serve` above 32K context turns chunked prefill on
V0_LONG_CONTEXT_TOKENS = 32 * 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's _DEFAULT_MAX_NUM_BATCHED_TOKENS
BIG_GPU_BYTES = 70 * GiB  # get_batch_defaults: device memory >= 70 GiB and not an A100
HUGE_GPU_BYTES = 160 * GiB  # PR #51726
CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE = 300 * 1024  # per extra captured size and decoder layer (calibrated)
MAX_CUDAGRAPH_CAPTURE_SIZE = 512


def profile(version: str) -> Profile:
    """The modelled release ``version`` (one of :data:`VERSIONS`)."""
    try:
        return PROFILES[version]
    except KeyError:
        raise InputError(f"unknown --engine-version {version!r} for vllm",
                         "modelled versions: " + ", ".join(VERSIONS)) from None


def batch_defaults(version: str, gpu_memory_bytes: int | None, *, gpu_name: str | None = None,
                   max_model_len: int | None = None, usage_context: str = "serve") -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` vLLM picks when the user sets neither.

    V0 (``0.6``): 256 sequences; chunked prefill only for ``vllm serve`` above 32K context (then 2048
    tokens), otherwise one prefill of ``max(max_model_len, 2048)`` tokens.
    V1 (``get_batch_defaults``, PR #17885): device memory >= 70 GiB and not an A100: ``serve`` 8192 /
    ``LLM`` 16384 tokens, 1024 sequences; else ``serve`` 2048 / ``LLM`` 8192 tokens, 256 sequences.
    ``0.32`` adds the >= 160 GiB tier: ``serve`` 16384 tokens (PR #51726; it catches the MI300X too).
    """
    if usage_context not in USAGE_CONTEXTS:
        raise InputError(f"unknown usage context {usage_context!r}", "use serve (vllm serve) or llm (the LLM class)")
    serve = usage_context == "serve"
    rule = profile(version).batch_rule
    if rule == "v0":
        if serve and max_model_len is not None and max_model_len > V0_LONG_CONTEXT_TOKENS:
            return V0_CHUNKED_PREFILL_TOKENS, 256
        return max(max_model_len or DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_BATCHED_TOKENS), 256
    memory = gpu_memory_bytes or 0
    big = memory >= BIG_GPU_BYTES and "a100" not in (gpu_name or "").lower()
    if rule == "v1-160" and memory >= HUGE_GPU_BYTES and serve:
        return 16384, 1024
    if big:
        return (8192 if serve else 16384), 1024
    return (2048 if serve else 8192), 256


def defaults(version: str, gpu_memory_bytes: int | None, is_cpu: bool, *, gpu_name: str | None = None,
             max_model_len: int | None = None, usage_context: str = "serve", tp: int = 1,
             pp: int = 1) -> EngineDefaults:
    """vLLM's defaults for ``version``: utilisation, block size (GPU 16, CPU 128), batching limits.

    The batching limits depend on the device memory and name and on ``usage_context`` (``serve`` =
    ``vllm serve``, ``llm`` = the ``LLM`` class); see :func:`batch_defaults`. CPU: 4096 tokens.
    """
    p = profile(version)
    notes: list[str] = []
    if not p.gpu_util_verified:
        notes.append(f"default gpu_memory_utilization {p.gpu_util} for vLLM {version} is unverified (0.9 -> 0.92 "
                     "happened by 0.32; the exact release was not found)")
    if is_cpu:
        return EngineDefaults(ENGINE, version, 1.0, CPU_BLOCK_SIZE, CPU_MAX_NUM_BATCHED_TOKENS, 256, p.mode,
                              usage_context, False, p.refusal, p.kv_tokens_rule, tuple(notes))
    mnbt, seqs = batch_defaults(version, gpu_memory_bytes, gpu_name=gpu_name, max_model_len=max_model_len,
                                usage_context=usage_context)
    return EngineDefaults(ENGINE, version, p.gpu_util, 16, mnbt, seqs, p.mode, usage_context,
                          p.cudagraph == "subtracted", p.refusal, p.kv_tokens_rule, tuple(notes))


def requested_bytes(total_bytes: int, gpu_util: float, rounding: str) -> int:
    """What vLLM may use: ``ceil(total x util)`` (>= 0.19) or the float product floored (before).

    Flooring the float product gives vLLM's block count exactly, since blocks are
    ``int((total * util - non_kv) // block_bytes)`` and ``non_kv`` and ``block_bytes`` are integers.
    """
    product = total_bytes * gpu_util
    return math.ceil(product) if rounding == "ceil" else math.floor(product)


def activation_parts(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int,
                     version: str = DEFAULT_VERSION) -> tuple[int, int]:
    """``(forward, sampler)`` peak bytes of vLLM's profile run, per GPU; the activation term is their max.

    forward: ``max_num_batched_tokens x`` :func:`~kvplan.engines.forward_bytes_per_token`.
    sampler: ``rows = min(max_num_seqs, max_num_batched_tokens)`` fp32 logit rows over the padded
    vocab, ``sampler_copies`` times (V0: 10, the sort / softmax / top-p / scatter / log-softmax copies
    of its top-k/top-p dummy run, on the driver rank whose budget is the minimum; V1: 2 in 0.10
    (FlashInfer), 10 in 0.11 (native path), 5 from 0.19). The logits are gathered to the full vocab,
    so this part does not shrink with tp.
    """
    p = profile(version)
    forward = max_num_batched_tokens * forward_bytes_per_token(spec, tp, act_bytes)
    rows = min(max_num_seqs, max_num_batched_tokens)
    return forward, sampler_bytes(rows, spec.vocab_size, p.sampler_copies)


def rope_cache_bytes(spec: ModelSpec, act_bytes: int) -> int:
    """The rotary embedding's cos/sin cache vLLM allocates while loading (kvplan: in "overhead").

    One ``[max_position_embeddings, rotary_dim]`` tensor in the model dtype, shared by all layers and
    replicated on every rank: Llama-3.1-8B 131,072 x 128 x 2 B = 32 MiB (its logged weights are
    14.9888 GiB against a 14.9577 GiB checkpoint; Llama-3-8B at 8,192 positions: 2 MiB, 14.9595 GiB).
    MLA models rotate only ``qk_rope_head_dim`` and are not counted (a few MiB).
    """
    attn = next((layer for layer in spec.layers if layer.kind is LayerKind.FULL or layer.kind is LayerKind.SLIDING
                 or layer.kind is LayerKind.CHUNKED), None)
    if attn is None or not spec.max_position_embeddings:
        return 0
    return spec.max_position_embeddings * attn.head_dim * act_bytes


def capture_sizes(max_size: int) -> list[int]:
    """CUDA-graph batch sizes vLLM captures up to ``max_size``: 1, 2, 4, 8..256 by 8, 272..512 by 16."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, MAX_CUDAGRAPH_CAPTURE_SIZE + 1, 16))
    return [s for s in sizes if s <= max_size]


def cudagraph_bytes(spec: ModelSpec, tp: int, pp: int, max_num_seqs: int, max_num_batched_tokens: int,
                    act_bytes: int) -> tuple[int, int, int]:
    """vLLM's CUDA-graph memory estimate (>= 0.21) and the graph counts: ``(bytes, piecewise, full)``.

    Piecewise graphs are captured up to ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``
    tokens, FULL decode graphs up to ``min(max_num_seqs, that)``. vLLM captures the largest graph of
    each mode (its activation pool: the forward peak at that size) and extrapolates the second one
    to the rest; kvplan charges ``300 KiB x decoder layers on this GPU`` per extra graph, calibrated
    on two logs (PIECEWISE=51 + FULL=35 -> 1.62 GiB; PIECEWISE=16 -> 0.36 GiB). An estimate: pass
    ``--cudagraph-gib`` with the number from your log ("Estimated CUDA graph memory").
    """
    largest = min(2 * max_num_seqs, MAX_CUDAGRAPH_CAPTURE_SIZE, max_num_batched_tokens)
    piecewise = capture_sizes(largest)
    full = capture_sizes(min(max_num_seqs, largest))
    layers = -(-spec.num_layers // pp)
    shared = largest * forward_bytes_per_token(spec, tp, act_bytes)
    extra = (max(0, len(piecewise) - 1) + max(0, len(full) - 1)) * layers * CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE
    return shared + extra, len(piecewise), len(full)


def budget(total_bytes: int, gpu_util: float, weights: Term, activation: Term | None, overhead: Term | None,
           cudagraph: Term | None, kv_budget_override: int | None, *, spec: ModelSpec, tp: int,
           max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int, is_cpu: bool,
           version: str = DEFAULT_VERSION, pp: int = 1) -> Budget:
    """The per-GPU budget with every term; any term given by the caller replaces the model's.

    ``kv = requested - weights - activation - overhead - cudagraph`` (the terms vLLM ``version``
    subtracts); ``kv_budget_override`` (``--kv-budget``, vLLM's ``kv_cache_memory_bytes``; on the CPU
    backend ``VLLM_CPU_KVCACHE_SPACE``) replaces the result, leaving the terms informational.
    """
    p = profile(version)
    usable = requested_bytes(total_bytes, gpu_util, p.rounding)
    notes: list[str] = []
    forward = sampler = 0
    if is_cpu:
        activation = activation or Term("activation", 0, "not subtracted: the CPU backend sizes its KV cache "
                                                          "from VLLM_CPU_KVCACHE_SPACE")
        overhead = overhead or Term("overhead", 0, "not subtracted on the CPU backend")
        cudagraph = cudagraph or Term("cudagraph", 0, "none on the CPU backend")
        if kv_budget_override is not None:
            kv, source = kv_budget_override, "--kv-budget (VLLM_CPU_KVCACHE_SPACE)"
        else:
            kv, source = CPU_KVCACHE_SPACE_BYTES, "VLLM_CPU_KVCACHE_SPACE unset: vLLM's CPU default 4 GiB"
        return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source,
                      p.rounding, 0, 0, tuple(notes))
    if activation is None:
        forward, sampler = activation_parts(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, version)
        rows = min(max_num_seqs, max_num_batched_tokens)
        activation = Term("activation", max(forward, sampler),
                          f"estimate: max(forward {max_num_batched_tokens:,} tokens x "
                          f"{forward_bytes_per_token(spec, tp, act_bytes):,} B = {forward / GiB:.2f} GiB, "
                          f"sampler {rows:,} rows x {padded_vocab(spec.vocab_size):,} vocab x 4 B x "
                          f"{p.sampler_copies} = {sampler / GiB:.2f} GiB)")
    if overhead is None:
        rope = rope_cache_bytes(spec, act_bytes)
        overhead = Term("overhead", p.non_torch_bytes + rope,
                        f"estimate: non-torch memory {p.non_torch_bytes / GiB:.2f} GiB (NCCL, cuBLAS, workspaces: median "
                        f"of 6 logged values) + rotary cos/sin cache {rope / MiB:.0f} MiB (vLLM logs it with the weights)")
    if cudagraph is None:
        estimate, n_piecewise, n_full = cudagraph_bytes(spec, tp, pp, max_num_seqs, max_num_batched_tokens, act_bytes)
        what = f"PIECEWISE={n_piecewise}, FULL={n_full} -> {estimate / GiB:.2f} GiB"
        if p.cudagraph == "subtracted":
            cudagraph = Term("cudagraph", estimate, f"estimate: profiled CUDA graphs ({what}), subtracted since 0.21")
        elif p.cudagraph == "logged":
            cudagraph = Term("cudagraph", 0, f"not subtracted in {version} (estimate {what} is only logged)")
        else:
            cudagraph = Term("cudagraph", 0, f"not subtracted in {version}: graphs are captured after the KV cache, "
                                             "out of the 1 - gpu_util slack")
    if kv_budget_override is not None:
        kv, source = kv_budget_override, "--kv-budget"
    else:
        kv = usable - weights.bytes - activation.bytes - overhead.bytes - cudagraph.bytes
        source = "usable - weights - activation - overhead - cudagraph"
    return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source,
                  p.rounding, forward, sampler, tuple(notes))
