"""The engine's launch line: the settings that change the plan (:class:`Launch`), quantization and KV-dtype spellings,
and the flags they become.
"""

from __future__ import annotations


from kvplan.engines.terms import EngineDefaults
from kvplan.errors import InputError
from kvplan.frozen import frozen

# vLLM's / SGLang's --quantization: methods that quantize a 16-bit checkpoint while it loads (what the
# linear layers' weights become per element; embeddings and the LM head stay in the model dtype), and
# checkpoint formats, whose tensors are already quantized (the checkpoint's size is the answer).
ONLINE_QUANTIZATION = {"fp8": "fp8", "fbgemm_fp8": "fp8", "ptpc_fp8": "fp8", "experts_int8": "int8",
                       "bitsandbytes": "int4"}
CHECKPOINT_QUANTIZATION = ("awq", "awq_marlin", "gptq", "gptq_marlin", "gptq_marlin_24", "marlin", "compressed-tensors",
                           "modelopt", "modelopt_fp4", "mxfp4", "gguf", "quark", "torchao", "moe_wna16", "inc", "fp_quant",
                           "petit_nvfp4", "bitblas", "gptq_bitblas", "awq_triton", "tpu_int8", "hqq", "deepspeedfp")


def quantization_weights(method: str) -> tuple[str | None, str]:
    """``(weights dtype, how)`` for an engine's ``--quantization`` value: ``("fp8", ...)`` for online fp8,
    ``(None, ...)`` for a checkpoint format (its size stands); an unknown method is an InputError."""
    key = str(method).strip().lower()
    if key in ONLINE_QUANTIZATION:
        return ONLINE_QUANTIZATION[key], f"--quantization {key}: linear layers quantized to {ONLINE_QUANTIZATION[key]} at load"
    if key in CHECKPOINT_QUANTIZATION:
        return None, f"--quantization {key}: a checkpoint format, the checkpoint's size stands"
    raise InputError(f"unknown --quantization {method!r}",
                     "online: " + ", ".join(ONLINE_QUANTIZATION) + "; checkpoint formats: awq, gptq, compressed-tensors, "
                     "mxfp4, ... (or --weights-dtype fp8|int8|int4)")


@frozen
class Launch:
    """What an engine's start-up log and command line need from a plan (tokens, requests, bytes).

    The command line carries every setting of the plan that changes it (the engine's ``serve_command``):
    the model and its ``revision``, ``max_model_len``, utilisation, tp/pp, the run dtype when given (``dtype``), ``quantization``, the KV
    dtype, the SSM-state dtype when given (``ssm_dtype``), ``block_size`` and ``kv_budget_bytes`` when the
    user chose them, the batching limits when the user set them or the plan models another usage context
    than the server (``max_num_batched_tokens_flag``, ``max_num_seqs_flag``), ``enforce_eager``, and prefix
    caching when it differs from the engine's default (``prefix_caching_flag``). ``max_num_seqs`` is the
    engine's effective limit on requests running at once (the user's, vLLM's default, SGLang's derived
    ``max_running_requests``).
    """

    model_id: str
    max_model_len: int
    gpu_util: float
    tp: int
    pp: int
    model_dtype: str
    kv_dtype: str
    max_num_seqs: int
    max_requests: int
    kv_tokens: int
    capacity_tokens: int
    max_concurrency: float
    kv_tokens_rule: str = "concurrency"
    block_size: int | None = None
    kv_budget_bytes: int | None = None
    serve_model: str = ""  # what the launch command names: a local model's folder, else the model id
    max_num_seqs_flag: int | None = None  # --max-num-seqs to pass (the user's)
    dtype: str | None = None  # --dtype to pass (the user's, not auto)
    quantization: str | None = None  # --quantization to pass
    max_num_batched_tokens_flag: int | None = None  # --max-num-batched-tokens to pass
    enforce_eager: bool = False
    prefix_caching_flag: bool | None = None  # prefix caching on/off when it differs from the engine's default
    chunked_prefill_flag: bool | None = None  # vLLM's --[no-]enable-chunked-prefill (the user's)
    ssm_dtype: str | None = None  # --mamba-ssm-cache-dtype to pass (the user's)
    is_cpu: bool = False  # vLLM's CPU backend: no utilisation flag, the KV space sized by --kv-cache-memory-bytes
    revision: str | None = None  # --revision to pass (the Hub revision planned)
    kv_memory_bytes: int = 0  # the KV budget per GPU (what vLLM logs as "Available KV cache memory")
    lora: bool = False  # LoRA adapters served (--enable-lora)
    max_loras: int | None = None  # --max-loras to pass (the user's)
    max_lora_rank: int | None = None  # --max-lora-rank to pass (the user's)
    speculative: str | None = None  # the speculative decoding method (mtp, eagle, eagle3, ngram)
    speculative_tokens: int = 0  # tokens the draft proposes per step
    expert_parallel: bool = False  # --enable-expert-parallel
    state_slots: int = 0  # request slots of the engine's own state pool (SGLang's max_mamba_cache_size); 0: none
    swa_tokens: int = 0  # token slots of the engine's own sliding-window pool (SGLang's swa_layer_tokens); 0: none
    swa_full_tokens_ratio: float | None = None  # SGLang's --swa-full-tokens-ratio to pass (the user's)
    disable_hybrid_swa_memory: bool = False  # SGLang's --disable-hybrid-swa-memory
    kv_cache_dtype: str | None = "auto"  # --kv-cache-dtype as the engine spells the planned KV dtype ("auto": the model
    # dtype's); None: the engine has no spelling for it, so the plan is a what-if it cannot run (no command line)

    @property
    def speculative_config(self) -> str | None:
        """vLLM's ``--speculative-config`` JSON for the planned method, None when off."""
        if not self.speculative:
            return None
        return f'{{"method": "{self.speculative}", "num_speculative_tokens": {self.speculative_tokens or 1}}}'

    @property
    def speculative_algorithm(self) -> str | None:
        """SGLang's ``--speculative-algorithm`` for the planned method (MTP is SGLang's NEXTN), None when off."""
        return {"mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM"}.get(self.speculative or "")

    @property
    def ep_size(self) -> int | None:
        """SGLang's ``--ep-size``: expert parallelism over the tensor-parallel GPUs, None when off."""
        return self.tp if self.expert_parallel else None

    # the settings a command line passes only when they differ from the engine's default
    @property
    def tp_flag(self) -> int | None:
        return self.tp if self.tp > 1 else None

    @property
    def pp_flag(self) -> int | None:
        return self.pp if self.pp > 1 else None

    @property
    def kv_dtype_flag(self) -> str | None:
        """``--kv-cache-dtype`` as the engine spells it (:attr:`kv_cache_dtype`), None for ``auto``."""
        return None if self.kv_cache_dtype in ("auto", None) else self.kv_cache_dtype

    @property
    def kv_budget_tokens(self) -> int | None:
        """The pool's token slots when the KV budget was given (engines that size a pool in tokens)."""
        return self.capacity_tokens if self.kv_budget_bytes is not None else None

    @property
    def prefix_caching_on(self) -> bool:
        return self.prefix_caching_flag is True

    @property
    def prefix_caching_off(self) -> bool:
        return self.prefix_caching_flag is False

    @property
    def chunked_prefill_on(self) -> bool:
        return self.chunked_prefill_flag is True

    @property
    def chunked_prefill_off(self) -> bool:
        return self.chunked_prefill_flag is False


def kv_cache_dtype_spelling(kv_dtype: str, model_dtype: str, choices: dict[str, str]) -> str | None:
    """How an engine's ``--kv-cache-dtype`` names kvplan's KV dtype ``kv_dtype`` (a :class:`kvplan.units.DType`
    name): ``"auto"`` when it is the model dtype, else ``choices[kv_dtype]`` (the release's spellings: kvplan's
    dtype name -> the engine's choice), None when the release has none (the engine cannot run it)."""
    if kv_dtype == model_dtype:
        return "auto"
    return choices.get(kv_dtype)


def what_if_kv_dtype(engine: EngineDefaults, kv_dtype: str, choices: dict[str, str]) -> str:
    """The note of a plan whose KV dtype the engine cannot run: a what-if, with the release's choices."""
    names = ", ".join(dict.fromkeys(["auto", *choices.values()]))
    return (f"--kv-dtype {kv_dtype} is a what-if {engine.label} cannot run: its --kv-cache-dtype takes {names} "
            "(no launch line)")


def launch_flags(launch: Launch, spelling: tuple[tuple[str, str], ...]) -> list[str]:
    """The flags of the settings ``launch`` sets, in an engine's ``spelling``: ``(setting, flag)`` pairs in
    command-line order, ``setting`` a :class:`Launch` field or property, ``flag`` a format of the value
    (``"--block-size {}"``) or, for a switch, the flag alone. Unset settings (None, False) are left out."""
    out = []
    for setting, flag in spelling:
        value = getattr(launch, setting)
        if value is True:
            out.append(flag)
        elif value is not None and value is not False:
            out.append(flag.format(value))
    return out
