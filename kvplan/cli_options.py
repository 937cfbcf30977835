"""Shared typer option aliases (declared once, used by every command that takes estimate options).

Values stay strings where the user may type units (``8k``, ``24GiB``); :func:`kvplan.plan.options_from_values`
parses them, so the CLI and the YAML files accept exactly the same spellings.
"""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Annotated, Any, Callable, Optional, TypeVar

import typer

_P = "plan"  # help panel names
_B = "budget"
_M = "model"
_H = "hub"

ModelArg = Annotated[str, typer.Argument(help="Hub id (meta-llama/Llama-3.1-8B), bundled id, or local path to a config.json / model folder.", show_default=False)]
GpuOpt = Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPU from the catalogue (`kvplan gpus`), e.g. H100, a100-40gb, mi300x, cpu.", rich_help_panel=_P)]
GpuMemoryOpt = Annotated[Optional[str], typer.Option("--gpu-memory", help="GPU memory as the runtime reports it, e.g. 24GiB, 80GB (bare number = GiB). Overrides the catalogue.", rich_help_panel=_P)]
GpusOpt = Annotated[Optional[int], typer.Option("--gpus", help="Number of GPUs (= tp x pp).", rich_help_panel=_P)]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size: splits KV heads (replicated when tp > heads) and weights.", rich_help_panel=_P)]
PpOpt = Annotated[int, typer.Option("--pp", help="Pipeline-parallel size: splits layers (the largest stage decides).", rich_help_panel=_P)]
ContextOpt = Annotated[str, typer.Option("--context", "-c", help="Tokens per request (prompt + output), e.g. 8192, 8k, 128k.", rich_help_panel=_P)]
BatchOpt = Annotated[int, typer.Option("--batch", "-b", help="Concurrent requests for the fits verdict and max context.", rich_help_panel=_P)]
MaxModelLenOpt = Annotated[Optional[str], typer.Option("--max-model-len", help="Engine max_model_len (default: --context); `auto` = the longest that fits.", rich_help_panel=_P)]
UsageContextOpt = Annotated[str, typer.Option("--usage-context", help="vLLM defaults for `vllm serve` (serve) or the LLM class (llm).", rich_help_panel=_B)]
PrefixOpt = Annotated[str, typer.Option("--prefix-tokens", help="Tokens of a prefix shared by every request (prefix caching).", rich_help_panel=_P)]
PrefixCachingOpt = Annotated[Optional[bool], typer.Option("--prefix-caching/--no-prefix-caching", help="Engine prefix caching (default: the engine's; vLLM V1: on). Changes the blocks state layers keep.", rich_help_panel=_P, show_default=False)]
SsmDtypeOpt = Annotated[Optional[str], typer.Option("--ssm-dtype", help="SSM state dtype of hybrid models (vLLM --mamba-ssm-cache-dtype), e.g. float32.", rich_help_panel=_M)]
EngineOpt = Annotated[str, typer.Option("--engine", help="Serving engine whose budget rules to model: vllm or sglang.", rich_help_panel=_B)]
EngineVersionOpt = Annotated[Optional[str], typer.Option("--engine-version", help="Engine version whose rules to model: any release or dev build (0.19.0, 0.15.2rc1.dev93+g11a4c9d30); default: the newest modelled.", rich_help_panel=_B)]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help="Model (activation) dtype: auto, bf16, fp16, fp32 (default auto: the engine's choice; vLLM runs float32 checkpoints in bf16, fp16 without bf16 support).", rich_help_panel=_M)]
KvDtypeOpt = Annotated[Optional[str], typer.Option("--kv-dtype", help="KV cache dtype: auto, bf16, fp16, fp8, fp8_e5m2, int8, int4.", rich_help_panel=_M)]
WeightsDtypeOpt = Annotated[Optional[str], typer.Option("--weights-dtype", help="Quantized weights: fp8, int8, int4 (with fp16 group scales).", rich_help_panel=_M)]
WeightsGibOpt = Annotated[Optional[str], typer.Option("--weights-gib", help="Total weight size (all GPUs), e.g. 15, 14.96GiB.", rich_help_panel=_B)]
GpuUtilOpt = Annotated[Optional[float], typer.Option("--gpu-util", help="gpu_memory_utilization (default: the engine version's).", rich_help_panel=_B)]
KvBudgetOpt = Annotated[Optional[str], typer.Option("--kv-budget", help="Explicit KV budget per GPU (vLLM kv_cache_memory_bytes), e.g. 40GiB.", rich_help_panel=_B)]
ActivationOpt = Annotated[Optional[str], typer.Option("--activation-gib", help="Override the activation peak per GPU.", rich_help_panel=_B)]
OverheadOpt = Annotated[Optional[str], typer.Option("--overhead-gib", help="Override the non-torch runtime overhead per GPU.", rich_help_panel=_B)]
CudagraphOpt = Annotated[Optional[str], typer.Option("--cudagraph-gib", help="Override the CUDA-graph memory per GPU.", rich_help_panel=_B)]
BlockSizeOpt = Annotated[Optional[int], typer.Option("--block-size", help="Tokens per KV block (vLLM GPU default 16, CPU 128).", rich_help_panel=_B)]
MaxBatchedOpt = Annotated[Optional[str], typer.Option("--max-num-batched-tokens", help="Engine max_num_batched_tokens (default: the engine's for this GPU).", rich_help_panel=_B)]
MaxSeqsOpt = Annotated[Optional[int], typer.Option("--max-num-seqs", help="Engine max_num_seqs (default: the engine's for this GPU).", rich_help_panel=_B)]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="Hub revision (branch, tag or commit).", rich_help_panel=_H)]
TokenOpt = Annotated[Optional[str], typer.Option("--token", help="Hub token for gated models (default: HF_TOKEN or the saved token). Never printed.", rich_help_panel=_H, show_default=False)]
HubOpt = Annotated[bool, typer.Option("--hub", help="Read the model from the Hub even if a bundled spec exists.", rich_help_panel=_H)]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Never touch the network: local paths, bundled specs and the HF cache only.", rich_help_panel=_H)]
RefreshOpt = Annotated[bool, typer.Option("--refresh", help="Ask the Hub for the revision even when the HF cache holds it (default: a cached model is answered from the cache, its commit stated).", rich_help_panel=_H)]
LayersOpt = Annotated[Optional[int], typer.Option("--layers", help="Override the number of layers.", rich_help_panel=_M)]
KvHeadsOpt = Annotated[Optional[int], typer.Option("--kv-heads", help="Override the number of KV heads.", rich_help_panel=_M)]
HeadDimOpt = Annotated[Optional[int], typer.Option("--head-dim", help="Override the head dimension.", rich_help_panel=_M)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]


def _estimate_signature(
    gpu: GpuOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    gpus: GpusOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    context: ContextOpt = "8192",
    batch: BatchOpt = 1,
    max_model_len: MaxModelLenOpt = None,
    prefix_tokens: PrefixOpt = "0",
    prefix_caching: PrefixCachingOpt = None,
    engine: EngineOpt = "vllm",
    engine_version: EngineVersionOpt = None,
    usage_context: UsageContextOpt = "serve",
    dtype: DtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    weights_dtype: WeightsDtypeOpt = None,
    ssm_dtype: SsmDtypeOpt = None,
    weights_gib: WeightsGibOpt = None,
    gpu_util: GpuUtilOpt = None,
    kv_budget: KvBudgetOpt = None,
    activation_gib: ActivationOpt = None,
    overhead_gib: OverheadOpt = None,
    cudagraph_gib: CudagraphOpt = None,
    block_size: BlockSizeOpt = None,
    max_num_batched_tokens: MaxBatchedOpt = None,
    max_num_seqs: MaxSeqsOpt = None,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    hub: HubOpt = False,
    offline: OfflineOpt = False,
    refresh: RefreshOpt = False,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
) -> None:
    """Every estimate option, declared once (see :func:`with_estimate_options`)."""


def _resolved_params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """``fn``'s parameters with their annotations evaluated (typer reads them from ``__signature__``)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    return [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()]


ESTIMATE_PARAMS = tuple(_resolved_params(_estimate_signature))
F = TypeVar("F", bound=Callable[..., Any])


def with_estimate_options(fn: F) -> F:
    """Give a command every estimate option without repeating them.

    ``fn`` declares ``model`` first, its own options, and two plain parameters the decorator fills:
    ``values`` (a dict for :func:`kvplan.plan.options_from_values`) and ``token`` (the Hub token).
    typer sees ``model``, the estimate options, then ``fn``'s own options.
    """
    own = [p for p in _resolved_params(fn) if p.name not in ("values", "token")]
    names = {p.name for p in ESTIMATE_PARAMS}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        token = values.pop("token", None)
        return fn(*args, values=estimate_values(**values), token=token, **kwargs)

    params = own[:1] + list(ESTIMATE_PARAMS) + own[1:]
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # typer must read __signature__, not fn's
    return wrapper  # type: ignore[return-value]


def estimate_values(**kw: object) -> dict[str, object]:
    """Map CLI parameter names onto :func:`kvplan.plan.options_from_values` keys."""
    mapping = {"gpus": "gpu_count", "max_batched": "max_num_batched_tokens", "model_name": "model"}
    out = {mapping.get(k, k): v for k, v in kw.items()}
    if out.get("gpu") is None and out.get("gpu_memory") is None:
        out["gpu"] = "H100"
    return out
