"""The option table: every estimate option, declared once.

:data:`OPTIONS` is the one place an option is declared. From it come

- the :class:`Options` dataclass (one field per option, in base units: tokens, bytes) and
  :func:`options_from_values`, which parses what a user typed (``8k``, ``24GiB``);
- the CLI options of ``kvplan estimate`` / ``kvplan validate`` (:mod:`kvplan.cli.options`: flags, help, panel, default);
- the YAML fields of capacity, what-if and workload files (:mod:`kvplan.checks.scenario`: key, type, description).

**Adding an option is a one-place change**: append an :class:`Opt` to :data:`OPTIONS` (name, kind, help,
panel, default; ``field`` when the Options field has another name, ``flags`` for extra spellings such
as ``--kv-cache-dtype``). Then read it where it is used (``options.<field>`` in plan.py) and regenerate
docs/cli-reference.md. A new *kind* of value (not one of :data:`KINDS`) is the only case that touches
the projections: its typer type in cli_options.py and its YAML type in scenario.py.

This module imports neither typer nor pydantic: plan.py and the Python API use it without them.

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io
"""

from __future__ import annotations

import math
from dataclasses import field, fields
from typing import Any, Callable

from kvplan.errors import InputError
from kvplan.limits import (MAX_BARE_GIB, MAX_COUNT, MAX_DEVICE_BYTES, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS,
                           MAX_SIZE_BYTES, MAX_TOKENS)
from kvplan.frozen import frozen

ENGINE_NAMES = ("vllm", "sglang")  # the --engine choices; kvplan.engines.registry maps each to its module
USAGE_CONTEXTS = ("serve", "llm")  # vLLM's defaults for `vllm serve` and for the LLM class
SPECULATIVE_METHODS = ("mtp", "eagle", "eagle3", "ngram")  # --speculative: vLLM speculative_config methods
PANEL_PLAN, PANEL_BUDGET, PANEL_MODEL, PANEL_HUB = "plan", "budget", "model", "hub"
DEFAULT_GPU = "H100"
DEFAULT_CONTEXT = 8192  # tokens per request when neither --context nor --max-model-len is given (at most the model's
# maximum: vLLM's own default max_model_len is the model's maximum)


# ---------------------------------------------------------------------------------------------
# kinds of values: how each is typed, parsed and checked


MODEL_DTYPES = ("bfloat16", "float16", "float32")  # what an engine runs a model in (--dtype)


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _not_negative(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0


def _model_dtype(value: Any) -> bool:
    from kvplan.errors import KvplanError
    from kvplan.units import parse_dtype

    if not isinstance(value, str):
        return False
    if value.strip().lower() == "auto":
        return True
    try:
        return parse_dtype(value).name in MODEL_DTYPES
    except KvplanError:
        return False


def _fraction(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 1


def _count(value: Any, flag: str) -> Any:
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise InputError(f"invalid {flag} {value!r}: must be a positive integer")
        return int(value)
    return value


def _tokens(value: Any, flag: str) -> int:
    from kvplan.units import parse_tokens

    return parse_tokens(value, flag)


def _tokens_or_zero(value: Any, flag: str) -> int:
    return 0 if value in (0, "0") else _tokens(value, flag)


def _size(value: Any, flag: str) -> int:
    from kvplan.units import parse_gib

    return parse_gib(value, flag)


def _device_size(value: Any, flag: str) -> int:
    """A device's memory: a size, where a bare number is GiB up to :data:`~kvplan.limits.MAX_BARE_GIB` (a
    larger one is nvidia-smi's MiB more often than TiB of GPU: an error that says both)."""
    from kvplan.units import GiB, MiB, fmt_bytes

    text = str(value).strip()
    bare = not isinstance(value, bool) and (isinstance(value, (int, float)) or text.replace(".", "", 1).isdigit())
    if bare and float(text) > MAX_BARE_GIB:
        mib = math.ceil(float(text)) * MiB
        raise InputError(f"invalid {flag} {text}: a number without a unit is GiB, so this is "
                         f"{fmt_bytes(float(text) * GiB)} of one device",
                         f"nvidia-smi prints MiB: for {fmt_bytes(mib)} write {flag} {text}MiB; else give the unit, "
                         "e.g. 80GiB")
    return _size(value, flag)


def _size_or_zero(value: Any, flag: str) -> int:
    zero = value == 0 or (isinstance(value, str) and value.strip() in ("0", "0GiB", "0GB"))
    return 0 if zero else _size(value, flag)


def _number(value: Any, flag: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"invalid {flag} {value!r}: must be a number in (0, 1]") from None


def _as_typed(value: Any, flag: str) -> Any:
    return value


def _calibration(value: Any, flag: str) -> Any:
    """A calibration file's path -> the loaded :class:`kvplan.io.calibration.Calibration` (already loaded: kept)."""
    from kvplan.io.calibration import Calibration, load_calibration

    return value if isinstance(value, Calibration) else load_calibration(str(value))


def _is_calibration(value: Any) -> bool:
    from kvplan.io.calibration import Calibration

    return isinstance(value, Calibration)


@frozen
class Kind:
    """One kind of option value.

    ``field_type``: the :class:`Options` field's type; ``cli_type``: what typer parses (``str`` for
    values with units, parsed by ``parse``); ``parse(value, flag)``: user-typed value -> base units;
    ``check``: whether an Options value is valid (``None`` always is when the default is ``None``), and
    ``rule`` what the error says otherwise; ``choices``: the allowed values of a closed set.
    """

    field_type: str
    cli_type: type
    parse: Callable[[Any, str], Any] = _as_typed
    check: Callable[[Any], bool] | None = None
    rule: str = ""
    choices: tuple[str, ...] = ()
    high: int | None = None  # the largest value (counts, tokens, bytes): checked with units.check_number


KINDS: dict[str, Kind] = {
    "text": Kind("str", str),
    "revision": Kind("str", str),
    "version": Kind("str", str),
    "gpu": Kind("str", str),
    "dtype": Kind("str", str, check=_model_dtype, rule="must be auto, bfloat16 (bf16), float16 (fp16, half) or float32 "
                  "(fp32, float): the dtype the engine runs the model in (quantized weights: --weights-dtype or "
                  "--quantization; the KV cache: --kv-dtype)"),
    "kv_dtype": Kind("str", str),
    "weights_dtype": Kind("str", str),
    "ssm_dtype": Kind("str", str),
    "engine": Kind("str", str, choices=ENGINE_NAMES),
    "usage": Kind("str", str, choices=USAGE_CONTEXTS),
    "count": Kind("int", int, _count, _positive, "must be a positive integer", high=MAX_COUNT),
    "tokens": Kind("int", str, _tokens, _positive, "must be a positive integer", high=MAX_TOKENS),
    "tokens_or_zero": Kind("int", str, _tokens_or_zero, _not_negative, "must not be negative", high=MAX_TOKENS),
    "max_model_len": Kind("int", str, _tokens, _positive, "must be a positive integer", high=MAX_TOKENS),  # or "auto"
    "size": Kind("int", str, _size, _positive, "must be positive", high=MAX_SIZE_BYTES),
    "size_or_zero": Kind("int", str, _size_or_zero, _not_negative, "must not be negative", high=MAX_SIZE_BYTES),
    "size_device": Kind("int", str, _device_size, _positive, "must be positive", high=MAX_DEVICE_BYTES),
    "fraction": Kind("float", str, _number, _fraction, "must be in (0, 1]"),
    "flag": Kind("bool", bool),  # --hub
    "switch": Kind("bool", bool),  # --prefix-caching/--no-prefix-caching; None = the engine's default
    "calibration": Kind("object", str, _calibration, _is_calibration, "must be a calibration file"),
    "speculative": Kind("str", str, choices=SPECULATIVE_METHODS),
}


# ---------------------------------------------------------------------------------------------
# the table


@frozen
class Opt:
    """One estimate option.

    ``name``: the CLI parameter, the YAML key and the :func:`options_from_values` key; ``field``: the
    :class:`Options` field when it differs (``kv_budget`` -> ``kv_budget_bytes``); ``flags``: the CLI
    spellings (default ``--name-with-dashes``); ``default``: the Options default in base units;
    ``cli_default``: what the CLI shows when it differs (``None``: not shown); ``panel``: the CLI help
    panel ("" = not a CLI option: ``model`` is each command's argument); ``yaml``: a scenario field;
    ``in_options``: an :class:`Options` field (``token`` is not: it is never stored).
    """

    name: str
    kind: str
    help: str
    panel: str = PANEL_PLAN
    default: Any = None
    field: str = ""
    flags: tuple[str, ...] = ()
    cli_default: Any = ...
    yaml: bool = True
    in_options: bool = True
    show_default: bool = True
    high: int | None = None  # a tighter bound than the kind's (``--layers``)
    compare: bool = False  # ``kvplan estimate`` takes a comma-separated list of values (kvplan.checks.compare)

    @property
    def limit(self) -> int | None:
        """The largest value accepted (base units), or None."""
        return self.high if self.high is not None else KINDS[self.kind].high

    @property
    def field_name(self) -> str:
        return self.field or self.name

    @property
    def flag(self) -> str:
        """The flag errors name: ``--kv-budget``."""
        return self.cli_flags[0].split("/")[0]

    @property
    def cli_flags(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    @property
    def cli_value(self) -> Any:
        """The CLI default as typed (``"8192"`` for a token count of 8,192)."""
        if self.cli_default is not ...:
            return self.cli_default
        if self.default is None or (KINDS[self.kind].cli_type is not str and not self.compare):
            return self.default
        return str(self.default)  # typed text (a list of values is text too)


OPTIONS: tuple[Opt, ...] = (
    Opt("model", "text", "Hub id, bundled id or local path", panel=""),
    Opt("gpu", "gpu", f"GPU from the catalogue (`kvplan gpus`), e.g. H100, a100-40gb, mi300x, cpu; a list "
        f"(H100,H200,MI300X) prints one row per GPU (default {DEFAULT_GPU}, unless --gpu-memory is given).",
        flags=("--gpu", "-g"), compare=True),
    Opt("gpu_memory", "size_device", "GPU memory as the runtime reports it, e.g. 24GiB, 81559MiB (bare number = "
        "GiB, at most 1024; 80GB is 10^9 bytes x 80 = 74.51 GiB). Overrides the catalogue.", field="gpu_memory_bytes"),
    Opt("gpus", "count", "Number of GPUs (= tp x pp).", default=1, field="gpu_count", cli_default=None),
    Opt("tp", "count", "Tensor-parallel size: splits KV heads (replicated when tp > heads) and weights; a list "
        "(1,2,4) prints one row per size (default 1; with --gpus N alone, N; with --gpus and --pp, the rest).",
        default=1, flags=("--tp", "--tensor-parallel-size"), compare=True, cli_default=None),
    Opt("pp", "count", "Pipeline-parallel size: splits layers; each stage has its own weights and KV layers, and "
        "the stage with the fewest blocks decides (default 1; with --gpus and --tp, the rest).", default=1, flags=("--pp", "--pipeline-parallel-size"), cli_default=None),
    Opt("context", "tokens", "Tokens per request (prompt + output), e.g. 8192, 8k, 128k (default: the "
        "--max-model-len given, else 8192 or the model's maximum where that is shorter); a list (8k,32k) prints one "
        "row per context.", default=DEFAULT_CONTEXT, flags=("--context", "-c"), cli_default=None, compare=True),
    Opt("batch", "count", "Concurrent requests for the fits verdict and max context.", default=1,
        flags=("--batch", "-b")),
    Opt("max_model_len", "max_model_len", "Engine max_model_len (default: --context); `auto` = the longest that fits.",
        flags=("--max-model-len", "--context-length")),
    Opt("prefix_tokens", "tokens_or_zero", "Tokens of a prefix shared by every request (prefix caching).", default=0),
    Opt("prefix_caching", "switch", "Engine prefix caching (default: the engine's; vLLM V1: on). Changes the blocks "
        "state layers keep.", flags=("--prefix-caching/--no-prefix-caching",), show_default=False),
    Opt("engine", "engine", "Serving engine whose budget rules to model: vllm or sglang.", PANEL_BUDGET,
        default="vllm"),
    Opt("engine_version", "version", "Engine version whose rules to model: any release or dev build (0.19.0, "
        "0.15.2rc1.dev93+g11a4c9d30); default: the newest modelled.", PANEL_BUDGET),
    Opt("usage_context", "usage", "vLLM defaults for `vllm serve` (serve) or the LLM class (llm).", PANEL_BUDGET,
        default="serve"),
    Opt("dtype", "dtype", "The dtype the engine runs the model in, weights and activations: auto, bfloat16, float16 "
        "(half), float32 (float) (default auto: the engine's choice; vLLM runs float32 checkpoints in bf16, fp16 "
        "without bf16 support).", PANEL_MODEL),
    Opt("kv_dtype", "kv_dtype", "KV cache dtype: auto, bf16, fp16, fp8, fp8_e4m3, fp8_e5m2, int8, int4; a list "
        "(auto,fp8) prints one row per dtype.", PANEL_MODEL, flags=("--kv-dtype", "--kv-cache-dtype"), compare=True),
    Opt("weights_dtype", "weights_dtype", "Quantized weights: fp8, int8, int4 (with fp16 group scales).", PANEL_MODEL),
    Opt("quantization", "text", "vLLM's --quantization: fp8 (and fbgemm_fp8, ptpc_fp8) quantizes a 16-bit "
        "checkpoint's linear layers to 1 byte/param at load, embeddings and LM head kept; bitsandbytes to 4 bits; "
        "checkpoint formats (awq, gptq, compressed-tensors, mxfp4, ...) keep the checkpoint's size.", PANEL_MODEL,
        flags=("--quantization", "-q")),
    Opt("ssm_dtype", "ssm_dtype", "SSM state dtype of hybrid models (vLLM --mamba-ssm-cache-dtype), e.g. float32.", PANEL_MODEL),
    Opt("weights_gib", "size", "Total weight size (all GPUs), e.g. 15, 14.96GiB.", PANEL_BUDGET, field="weights_bytes"),
    Opt("gpu_util", "fraction", "gpu_memory_utilization (SGLang: mem_fraction_static; default: the engine "
        "version's).", PANEL_BUDGET, flags=("--gpu-util", "--gpu-memory-utilization", "--mem-fraction-static")),
    Opt("kv_budget", "size", "Explicit KV budget per GPU (vLLM kv_cache_memory_bytes), e.g. 40GiB.",
        PANEL_BUDGET, field="kv_budget_bytes"),
    Opt("activation_gib", "size_or_zero", "Override the activation peak per GPU.", PANEL_BUDGET,
        field="activation_bytes"),
    Opt("overhead_gib", "size_or_zero", "Override the non-torch runtime overhead per GPU.", PANEL_BUDGET,
        field="overhead_bytes"),
    Opt("cudagraph_gib", "size_or_zero", "Override the CUDA-graph memory per GPU.", PANEL_BUDGET,
        field="cudagraph_bytes"),
    Opt("calibration", "calibration", "Calibration file written by `kvplan explain --calibrate`: measured terms are "
        "used where model, GPU, engine release, tp/pp, dtype and batching limits match.", PANEL_BUDGET),
    Opt("enforce_eager", "flag", "vLLM's --enforce-eager: no CUDA graphs, so no CUDA-graph memory term.", PANEL_BUDGET,
        default=False),
    Opt("enable_lora", "flag", "LoRA adapters served (vLLM --enable-lora): their weight slots take memory "
        "(--max-loras x --max-lora-rank).", PANEL_BUDGET, default=False),
    Opt("max_loras", "count", "LoRA adapters the engine keeps weight slots for (vLLM --max-loras, default 1 with "
        "--enable-lora; SGLang --max-loras-per-batch).", PANEL_BUDGET),
    Opt("max_lora_rank", "count", "The rank LoRA slots are sized for (vLLM --max-lora-rank, default 16).",
        PANEL_BUDGET),
    Opt("speculative", "speculative", "Speculative decoding method (vLLM --speculative-config method): mtp gives the "
        "model's multi-token-prediction layers weights and a KV cache in the pool; eagle, eagle3, ngram.",
        PANEL_BUDGET),
    Opt("num_speculative_tokens", "count", "Tokens the draft proposes per step (vLLM num_speculative_tokens, "
        "default 1).", PANEL_BUDGET),
    Opt("flashinfer", "switch", "Whether FlashInfer is installed where vLLM 0.8 - 0.11 run: their profiled sampler "
        "takes FlashInfer's top-k/top-p where it is (the project's Docker images) and the native torch sort "
        "otherwise (a plain pip install; the start-up log says \"FlashInfer is not available\"). Unset: kvplan "
        "plans FlashInfer and its range reaches the native path. Other releases' path does not depend on it.",
        PANEL_BUDGET, flags=("--flashinfer/--no-flashinfer",), show_default=False),
    Opt("expert_parallel", "flag", "vLLM --enable-expert-parallel: MoE experts split over the GPUs (each GPU's "
        "fused-MoE workspaces use the whole expert width).", PANEL_BUDGET, default=False),
    Opt("swa_full_tokens_ratio", "fraction", "SGLang's --swa-full-tokens-ratio: the sliding-window pool's tokens per "
        "full-attention pool token where the release gives the model its hybrid SWA pool (default 0.8).",
        PANEL_BUDGET),
    Opt("disable_hybrid_swa_memory", "flag", "SGLang's --disable-hybrid-swa-memory: one pool of full layers, each "
        "holding every token, for a model that would get the hybrid SWA pool.", PANEL_BUDGET, default=False),
    Opt("block_size", "count", "Tokens per KV block (vLLM GPU default 16, CPU 128; SGLang's --page-size, 1).",
        PANEL_BUDGET, flags=("--block-size", "--page-size")),
    Opt("max_num_batched_tokens", "tokens", "Engine max_num_batched_tokens (SGLang: chunked_prefill_size; default: "
        "the engine's for this GPU).", PANEL_BUDGET, flags=("--max-num-batched-tokens", "--chunked-prefill-size")),
    Opt("chunked_prefill", "switch", "vLLM's chunked prefill (default: the release's; V0 above 32K tokens). Off, the "
        "profile prefills max_model_len tokens at once (V1 0.8 - 0.10 always chunk).", PANEL_BUDGET, show_default=False,
        flags=("--chunked-prefill/--no-chunked-prefill", "--enable-chunked-prefill/--no-enable-chunked-prefill")),
    Opt("max_num_seqs", "count", "Engine max_num_seqs (SGLang: max_running_requests; default: the engine's for this "
        "GPU).", PANEL_BUDGET, flags=("--max-num-seqs", "--max-running-requests")),
    Opt("revision", "revision", "Hub revision (branch, tag or commit).", PANEL_HUB),
    Opt("token", "text", "Hub token for gated models (default: HF_TOKEN or the saved token). Never printed.",
        PANEL_HUB, yaml=False, in_options=False, show_default=False),
    Opt("hub", "flag", "Read the model from the Hub even if a bundled spec exists.", PANEL_HUB, default=False),
    Opt("offline", "flag", "Never touch the network: local paths, bundled specs and the HF cache only.", PANEL_HUB,
        default=False),
    Opt("refresh", "flag", "Ask the Hub for the revision even when the HF cache holds it (default: a cached model is "
        "answered from the cache, its commit stated).", PANEL_HUB, default=False),
    Opt("layers", "count", "Override the number of layers.", PANEL_MODEL, high=MAX_LAYERS),
    Opt("kv_heads", "count", "Override the number of KV heads.", PANEL_MODEL, high=MAX_HEADS),
    Opt("head_dim", "count", "Override the head dimension.", PANEL_MODEL, high=MAX_HEAD_DIM),
    Opt("images", "count", "Images per request whose tokens cross-attention layers cache (Llama-3.2-Vision; "
        "default 1 at the most tiles).", PANEL_MODEL),
)
BY_NAME: dict[str, Opt] = {o.name: o for o in OPTIONS}
BY_FIELD: dict[str, Opt] = {o.field_name: o for o in OPTIONS if o.in_options}
CLI_OPTIONS: tuple[Opt, ...] = tuple(o for o in OPTIONS if o.panel)
YAML_OPTIONS: tuple[Opt, ...] = tuple(o for o in OPTIONS if o.yaml)

# options that say where a model is read from, not what is planned
SOURCE_ONLY = ("hub", "offline", "refresh")
PLAN_OPTIONS: tuple[Opt, ...] = tuple(o for o in YAML_OPTIONS if o.in_options and o.name not in SOURCE_ONLY)
"""Every option that changes a plan, in table order: what a report row or a plan's :func:`option_values_of`
holds so that the plan can be made again."""

# the per-request axes of a sweep, outermost first: everything else decides the pool (budget, layout, blocks)
ROW_AXES = ("max_model_len", "context", "batch")
# a sweep's canonical nesting: the pool-deciding options outermost (table order), the per-request ones innermost
AXIS_ORDER = tuple(o.name for o in YAML_OPTIONS if o.name not in ROW_AXES) + ROW_AXES


# ---------------------------------------------------------------------------------------------
# Options


# (field, type, value) that passed the field's own check, which reads the value alone: plans re-make Options by the
# ten thousand (``dataclasses.replace`` of one field). Bounded: cleared at 8,192.
_VALID: set[tuple[str, type, Any]] = set()


def _validate(self: Any) -> None:
    """Each option's own check (from its kind), then the checks across options."""
    for opt in BY_FIELD.values():
        value = getattr(self, opt.field_name)
        if value is None and opt.default is None:
            continue
        seen = (opt.field_name, type(value), value)
        try:
            if seen in _VALID:
                continue
        except TypeError:  # an unhashable value (the Python API) is checked, never remembered
            _check_field(opt, value)
            continue
        _check_field(opt, value)
        if len(_VALID) > 8192:
            _VALID.clear()
        _VALID.add(seen)
    if self.tp * self.pp != self.gpu_count:
        if self.gpu_count == 1 and (self.tp > 1 or self.pp > 1):
            object.__setattr__(self, "gpu_count", self.tp * self.pp)
        elif self.tp == 1 and self.pp == 1:  # --gpus N alone: tensor parallelism over all of them (a plan note says so)
            object.__setattr__(self, "tp", self.gpu_count)
            object.__setattr__(self, "tp_from_gpus", True)
        else:
            raise InputError(f"--tp {self.tp} x --pp {self.pp} = {self.tp * self.pp} does not match --gpus {self.gpu_count}",
                             "set --gpus to tp x pp")

    if self.gpu is None and self.gpu_memory_bytes is None:
        object.__setattr__(self, "gpu", DEFAULT_GPU)
    if self.num_speculative_tokens and not self.speculative:
        raise InputError(f"--num-speculative-tokens {self.num_speculative_tokens} needs --speculative",
                         "name the method: --speculative " + "|".join(SPECULATIVE_METHODS))
    if self.prefix_tokens > self.context:
        raise InputError(f"--prefix-tokens {self.prefix_tokens} exceeds --context {self.context}")


def _check_field(opt: Opt, value: Any) -> None:
    """One option's own check, from its kind: raises :class:`InputError` naming the flag and the value."""
    kind = KINDS[opt.kind]
    if isinstance(value, str) and not value.strip() and opt.name != "model":  # the model names its own error
        raise InputError(f"invalid {opt.flag} {value!r}: must not be empty", "leave the option out for its default")
    if kind.check is not None and not kind.check(value):
        raise InputError(f"invalid {opt.flag} {value!r}: {kind.rule}")
    if kind.choices and value not in kind.choices:
        raise InputError(f"invalid {opt.flag} {value!r}", "use one of: " + ", ".join(kind.choices))
    if opt.limit is not None:
        _check_high(opt, value, opt.limit)


def _typed(value: Any) -> str:
    """A value as the user typed it: ``92`` (not ``92.0``), ``'lots'`` (text quoted)."""
    if isinstance(value, str):
        text = value.strip()
        return text if _NUMERIC.match(text) else repr(value)
    return repr(value)


def _mistyped_hint(opt: Opt, parsed: Any) -> str | None:
    """What a value that breaks its option's rule most likely meant: a percentage for a fraction."""
    if opt.kind == "fraction" and isinstance(parsed, (int, float)) and 1 < parsed <= 100:
        return f"did you mean {opt.flag} {parsed / 100:g}? it is a fraction of the memory, not a percentage"
    return None


_NUMERIC = __import__("re").compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _check_high(opt: Opt, value: Any, high: int, typed: Any = None) -> None:
    """``value`` (base units) must be at most ``high``; the error echoes what the user typed (``typed``, e.g.
    ``1e30``) when known, else the value in base units (bytes, tokens)."""
    from kvplan.units import check_number, fmt_bytes

    try:
        check_number(value, opt.flag, high=high)
    except InputError:
        if typed is not None:
            got = str(typed)
        elif opt.kind.startswith("size"):
            got = f"{value:,} B" if isinstance(value, int) else repr(value)
        else:
            got = str(value)  # as the option takes it: no thousands separators
        most = fmt_bytes(high) if opt.kind.startswith("size") else str(high)
        raise InputError(f"invalid {opt.flag} {got}: must be at most {most}",
                         "a value this large is a typo or a unit mix-up") from None


def check_context(context: int, max_model_len: int | None, *, auto: bool = False) -> None:
    """A request's context must fit the engine's max_model_len: vLLM rejects longer requests (it does not
    truncate them), so a plan for them would count memory no request can use.

    Checked on what a user gives (:func:`options_from_values`: the CLI, the YAML files, the Python API) and
    on ``--max-model-len auto`` once the plan has resolved it (``auto``) and on every suggested change
    (:func:`kvplan.planning.suggest.revise`); kvplan's own probes (``dataclasses.replace`` of a plan's options) may look
    past it. Messages and hints print values as the flags take them (``32768``, never ``32,768``).
    """
    if max_model_len is None or context <= max_model_len:
        return
    if auto:
        raise InputError(f"--context {context} exceeds --max-model-len auto = {max_model_len} (the longest the "
                         "engine starts with): the engine rejects requests longer than max_model_len",
                         f"lower --context to {max_model_len}")
    raise InputError(f"--context {context} exceeds --max-model-len {max_model_len}: the engine rejects requests "
                     "longer than max_model_len", f"raise --max-model-len to {context} or lower --context")


def default_context(options: Any) -> bool:
    """Whether ``options`` plan the default context (neither ``--context`` nor ``--max-model-len`` given), which
    :func:`kvplan.planning.plan.plan_for_spec` lowers to a shorter model's maximum."""
    return options.context_from_default and not options.max_model_len and options.context <= DEFAULT_CONTEXT


def context_source(options: Any) -> str:
    """Where the planned context came from: ``given`` (``--context``, or ``--max-model-len`` alone), ``default``
    (:data:`~kvplan.options.DEFAULT_CONTEXT`) or ``model maximum`` (the default lowered to a shorter model's)."""
    if not default_context(options):
        return "given"
    return "default" if options.context == DEFAULT_CONTEXT else "model maximum"


def typed_value(opt: Opt, value: Any) -> Any:
    """An :class:`Options` value as the option takes it (:func:`options_from_values`, a YAML file): sizes as
    a number of GiB (bytes / 2^30, exact in a float), a calibration as its file's path, the rest as stored."""
    from kvplan.units import GiB

    if value is None:
        return None
    if opt.kind.startswith("size"):
        return value / GiB
    if opt.kind == "calibration":
        return value.path
    return value


def option_values_of(options: Any, resolved: dict[str, Any]) -> dict[str, Any]:
    """Every option of :data:`PLAN_OPTIONS` (table order) as :func:`options_from_values` takes it: the value
    ``resolved`` by a plan where it has one (the engine's defaults made explicit), else as set in
    ``options`` (``None``: the default). Planning these values again gives the same plan."""
    return {o.name: resolved[o.name] if o.name in resolved else typed_value(o, getattr(options, o.field_name))
            for o in PLAN_OPTIONS}


def _split_gpus(kwargs: dict[str, Any]) -> None:
    """``--gpus N`` with one of ``--tp`` / ``--pp`` given: the other takes the rest (``--gpus 2 --tp 1`` is pp 2,
    a note says so); both given must multiply to N. ``--gpus N`` alone is tensor parallelism over all N
    (:class:`Options`). Values as :func:`options_from_values` parsed them, in place."""
    gpus, tp, pp = kwargs.get("gpu_count"), kwargs.get("tp"), kwargs.get("pp")
    if not _positive(gpus) or (tp is None and pp is None) or not all(v is None or _positive(v) for v in (tp, pp)):
        return  # nothing to split (Options checks each value)
    if tp is not None and pp is not None:
        if tp * pp != gpus:
            raise InputError(f"--tp {tp} x --pp {pp} = {tp * pp} does not match --gpus {gpus}", "set --gpus to tp x pp")
        return
    given, other, n = ("tp", "pp", tp) if tp is not None else ("pp", "tp", pp)
    if gpus % n:
        raise InputError(f"--gpus {gpus} is not a multiple of --{given} {n}: the rest cannot be split evenly by --{other}",
                         f"give --gpus as tp x pp (e.g. --gpus {-(-gpus // n) * n}), or both --tp and --pp")
    kwargs[other] = gpus // n
    if gpus // n > 1:
        kwargs["split_given"] = given
        kwargs["tp_from_gpus"] = other == "tp"


def _options_class() -> type:
    required = [(o.field_name, KINDS[o.kind].field_type) for o in BY_FIELD.values() if o.name == "model"]
    optional = [(o.field_name, f"{KINDS[o.kind].field_type} | None" if o.default is None else KINDS[o.kind].field_type,
                 field(default=o.default)) for o in BY_FIELD.values() if o.name != "model"]
    extra = [("auto_max_model_len", "bool", field(default=False)),  # --max-model-len auto: the longest that fits
             ("tp_from_gpus", "bool", field(default=False)),  # --gpus N alone (or with --pp) set tp
             ("split_given", "str", field(default="")),  # --gpus N with --tp or --pp ("tp", "pp"): the other took the rest
             ("context_from_default", "bool", field(default=False))]  # neither --context nor --max-model-len given:
    # the context is DEFAULT_CONTEXT, or the model's maximum where that is shorter (kvplan.planning.plan)
    specs = required + optional + extra  # what make_dataclass takes: (name, type) or (name, type, field)
    return frozen(type("Options", (), {
        "__module__": __name__, "__post_init__": _validate,
        "__doc__": "Every estimate option, in base units (tokens, bytes); ``None`` means \"the default\".\n\n"
                   "One field per :data:`kvplan.options.OPTIONS` entry (plus ``auto_max_model_len``). The CLI, the "
                   "Python API and the YAML scenario files all build one of these.",
        "__annotations__": {spec[0]: spec[1] for spec in specs}, **{spec[0]: spec[2] for spec in specs if len(spec) > 2},
    }))  # make_dataclass's class, made by @frozen


Options = _options_class()


def options_from_values(values: dict[str, Any]) -> Any:
    """Build :class:`Options` from user-typed values: ``context='8k'``, ``kv_budget='12GiB'``, ``tp=2``.

    Keys are option names (:data:`OPTIONS`: the CLI flags with underscores, ``gpus`` for ``--gpus``),
    parsed by their kind (sizes take a number of GiB or a size with its unit, ``80GB``, ``24GiB``; token
    counts ``8192``, ``8k``, ``128k``; ``max_model_len`` also ``auto``; a ``max_model_len`` given without a
    ``context`` is the context too), or :class:`Options` field names
    with values in base units (``gpu_count``, ``kv_budget_bytes``). ``None`` values are left at their
    defaults; ``token`` is not an option of a plan (pass it to :func:`kvplan.planning.plan.estimate`).
    """
    known = {f.name for f in fields(Options)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        opt = BY_NAME.get(key)
        if key == "max_model_len" and isinstance(value, str) and value.strip().lower() == "auto":
            kwargs["auto_max_model_len"] = True
        elif opt is not None and opt.in_options:
            kind = KINDS[opt.kind]
            kwargs[opt.field_name] = parsed = kind.parse(value, opt.flag)
            blank = isinstance(value, str) and not value.strip()  # Options says "must not be empty"
            if kind.check is not None and parsed is not None and not blank and not kind.check(parsed):
                raise InputError(f"invalid {opt.flag} {_typed(value)}: {kind.rule}", _mistyped_hint(opt, parsed))
            if opt.limit is not None and isinstance(value, str):
                _check_high(opt, kwargs[opt.field_name], opt.limit, typed=value)
        elif key in known:
            kwargs[key] = value
        else:
            import difflib

            near = difflib.get_close_matches(key, [o.name for o in OPTIONS if o.in_options], n=1, cutoff=0.6)
            raise InputError(f"unknown option {key!r}", f"did you mean {near[0]!r}?" if near else
                             "the options are the CLI flags with underscores: gpu, context, kv_dtype, ...")
    _split_gpus(kwargs)
    if "context" not in kwargs and kwargs.get("max_model_len"):
        kwargs["context"] = kwargs["max_model_len"]  # a max_model_len given alone is the context planned
    elif "context" not in kwargs:
        kwargs["context_from_default"] = True  # the plan lowers it to a shorter model's maximum
    options = Options(**kwargs)
    check_context(options.context, options.max_model_len)
    return options
