"""The modelled engines by name, and how each spells the settings kvplan plans. Each engine is a module that
satisfies :class:`kvplan.engines.Engine`.

Imported lazily, so ``kvplan estimate`` loads only the engine it plans for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.errors import InputError
from kvplan.options import ENGINE_NAMES as NAMES

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.engines import Engine


def engine(name: str) -> "Engine":
    """The engine module called ``name`` (one of :data:`NAMES`)."""
    if name == "vllm":
        from kvplan.engines import vllm

        return vllm  # type: ignore[return-value]
    if name == "sglang":
        from kvplan.engines import sglang

        return sglang  # type: ignore[return-value]
    raise InputError(f"unknown engine {name!r}", "use one of: " + ", ".join(NAMES))


# kvplan's setting (an Options field) -> (the engine's flag, the engine's name for it in its logs and docs); kvplan
# accepts each engine's flag as an alias of its own option (kvplan.options.OPTIONS)
SETTINGS: dict[str, dict[str, tuple[str, str]]] = {
    "vllm": {"max_model_len": ("--max-model-len", "max_model_len"), "max_num_seqs": ("--max-num-seqs", "max_num_seqs"),
             "gpu_util": ("--gpu-memory-utilization", "gpu_memory_utilization"),
             "block_size": ("--block-size", "block_size"),
             "max_num_batched_tokens": ("--max-num-batched-tokens", "max_num_batched_tokens"),
             "chunked_prefill": ("--enable-chunked-prefill", "enable_chunked_prefill")},
    "sglang": {"max_model_len": ("--context-length", "context_length"),
               "max_num_seqs": ("--max-running-requests", "max_running_requests"),
               "gpu_util": ("--mem-fraction-static", "mem_fraction_static"), "block_size": ("--page-size", "page_size"),
               "max_num_batched_tokens": ("--chunked-prefill-size", "chunked_prefill_size"),
               # the hybrid sliding-window pool's settings (vLLM has no such pool)
               "swa_full_tokens_ratio": ("--swa-full-tokens-ratio", "swa_full_tokens_ratio"),
               "disable_hybrid_swa_memory": ("--disable-hybrid-swa-memory", "disable_hybrid_swa_memory")},
}


def has_setting(engine_name: str, setting: str) -> bool:
    """Whether the engine has kvplan's ``setting`` at all (vLLM has no ``swa_full_tokens_ratio``)."""
    return setting in SETTINGS.get(engine_name, SETTINGS["vllm"])


def flag(engine_name: str, setting: str) -> str:
    """The engine's command-line flag for kvplan's ``setting`` (``sglang``, ``max_num_seqs``:
    ``--max-running-requests``)."""
    return SETTINGS.get(engine_name, SETTINGS["vllm"])[setting][0]


def setting_name(engine_name: str, setting: str) -> str:
    """The engine's own name for kvplan's ``setting`` (``sglang``, ``max_num_seqs``: ``max_running_requests``)."""
    return SETTINGS.get(engine_name, SETTINGS["vllm"])[setting][1]
