"""How a quantized checkpoint stores its weights, read from its config's ``quantization_config``.

A config that declares a ``quantization_config`` describes a checkpoint much smaller than its parameters
in the model dtype. When no checkpoint size is known (no safetensors index or metadata), kvplan estimates the
weights tensor by tensor (:func:`kvplan.model.params.inventory`) the way the checkpoint stores them:

- which tensors are quantized: each method's rule (``fp8``, GPTQ, AWQ: the linear layers of the decoder;
  ``mxfp4``: the routed experts; ``compressed-tensors``: its ``config_groups`` targets; ``bitsandbytes``: every
  linear layer but the LM head; ...) less the config's ignore list (``modules_to_not_convert``, ``ignore``,
  ``ignored_layers``, ``exclude_modules``, ``llm_int8_skip_modules``); embeddings, norms and routers keep the
  model dtype;
- how each is stored (:class:`Storage`): bits per weight plus its scales (fp8 block quantization: one
  float32 per 128 x 128 block; MXFP4: 4 bits + one 8-bit exponent per 32 weights; GPTQ / AWQ: ``bits`` + one
  fp16 scale and one packed zero point per group, GPTQ's int32 ``g_idx`` per input column; NVFP4: 4 bits +
  one fp8 scale per 16 weights + float32 global scales; bitsandbytes 4-bit: one absmax per 64 weights).

Module names are matched in Llama / DeepSeek spelling (``block_sparse_moe`` / ``feed_forward`` read as
``mlp``, gpt-oss' ``router`` as ``gate``, ``backbone`` as ``model``). Plain patterns match whole dotted
segments anywhere in a name (``mlp.gate`` matches ``model.layers.3.mlp.gate``, not ``mlp.gate_proj``),
``*`` patterns match the whole name or a prefix of it, ``re:`` patterns are regular expressions matched
from the start (compressed-tensors' convention).
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from typing import Any, Mapping

from kvplan.model.config_reader import ConfigReader, short_repr
from kvplan.errors import ConfigError
from kvplan.model.source import SAFETENSORS_DTYPE_BITS
from kvplan.model.params import Tensors
from kvplan.units import cdiv
from kvplan.frozen import frozen


@frozen
class Storage:
    """How one quantized linear weight of ``rows x cols`` (out x in features) is stored.

    ``bits`` per weight, packed into ``weight_dtype`` elements. Scales in ``scale_dtype``: one per
    ``scale_block`` = (rows, cols) of weights, 0 meaning the whole dimension ((0, 0): one per tensor;
    (1, 0): one per output row; (1, 128): one per 128 inputs of a row; (128, 128): one per block), or one per
    ``flat_block`` weights of the flattened tensor (bitsandbytes). ``zero_dtype``: zero points in the scales'
    layout, packed at ``bits`` each. ``second_scale``: bitsandbytes' double quantization (one float32 per 256
    scales). ``per_tensor``: scalar tensors per weight (static input scales, global scales, shapes).
    ``per_column``: one element per input column (GPTQ's ``g_idx``).
    """

    label: str
    weight_dtype: str
    bits: int
    scale_dtype: str | None = None
    scale_block: tuple[int, int] = (0, 0)
    flat_block: int = 0
    zero_dtype: str | None = None
    second_scale: bool = False
    per_tensor: tuple[str, ...] = ()
    per_column: str | None = None

    def elements(self, t: Tensors) -> Counter[str]:
        """Stored elements per safetensors dtype of ``t``'s ``count`` weights."""
        out: Counter[str] = Counter()
        n, size = t.count, t.rows * t.cols
        out[self.weight_dtype] += n * cdiv(size * self.bits, SAFETENSORS_DTYPE_BITS[self.weight_dtype])
        if self.scale_dtype:
            if self.flat_block:
                scales = cdiv(size, self.flat_block)
            else:
                rows, cols = self.scale_block
                scales = cdiv(t.rows, rows or t.rows) * cdiv(t.cols, cols or t.cols)
            out[self.scale_dtype] += n * scales
            if self.zero_dtype:
                out[self.zero_dtype] += n * cdiv(scales * self.bits, SAFETENSORS_DTYPE_BITS[self.zero_dtype])
            if self.second_scale:
                out["F32"] += n * cdiv(scales, 256)
        for dtype in self.per_tensor:
            out[dtype] += n
        if self.per_column:
            out[self.per_column] += n * t.cols
        return out


# Which tensors a rule converts: every linear weight ("linear"), all but the LM head ("linear_no_head"), the
# decoder's linear layers without routers, embeddings and LM head ("decoder"), the routed experts ("experts").
_SELECTORS = {
    "linear": lambda t: t.linear and t.role != "mtp_proj",
    "linear_no_head": lambda t: t.linear and t.role not in ("lm_head", "mtp_proj"),
    "decoder": lambda t: t.linear and t.role in ("attention", "mlp", "experts", "shared_experts", "mixer"),
    "experts": lambda t: t.role == "experts",
}


@frozen
class Rule:
    """Tensors matching ``targets`` (selector names of :data:`_SELECTORS`, ``Linear``, or module patterns)
    are stored as ``storage``."""

    storage: Storage
    targets: tuple[str, ...]

    def selects(self, t: Tensors) -> bool:
        for target in self.targets:
            selector = _SELECTORS.get("linear" if target == "Linear" else target)
            if selector(t) if selector else (t.linear and matches(t.module, target)):
                return True
        return False


@frozen
class Quantization:
    """A config's ``quantization_config``: its method, storage rules (first match wins; none: a method kvplan
    does not model), the modules it leaves unquantized, and what it says about the KV cache.

    ``kv_cache``: ``"fp8"`` when the checkpoint asks for an fp8 KV cache that vLLM turns on under
    ``--kv-cache-dtype auto`` (ModelOpt's ``kv_cache_quant_algo: FP8``); ``"scales"`` when it only ships fp8 KV
    scales (compressed-tensors' ``kv_cache_scheme``), used with ``--kv-cache-dtype fp8``; else ``""``.
    """

    method: str
    rules: tuple[Rule, ...]
    ignore: tuple[str, ...] = ()
    kv_cache: str = ""

    def storage(self, t: Tensors) -> Storage | None:
        if any(matches(t.module, p) for p in self.ignore):
            return None
        return next((rule.storage for rule in self.rules if rule.selects(t)), None)

    @property
    def labels(self) -> str:
        return "; ".join(dict.fromkeys(rule.storage.label for rule in self.rules))

    @property
    def weights_format(self) -> str:
        """The format the quantized weights are stored in, as kvplan names weight dtypes (``fp8_e4m3``, ``mxfp4``,
        ``nvfp4``, ``int8``, ``int4``; several joined by ``+``); the method's name when kvplan does not model it."""
        if not self.rules:
            return self.method
        return "+".join(dict.fromkeys(_format(rule.storage, self.method) for rule in self.rules))


def _format(storage: Storage, method: str) -> str:
    """One storage rule's weight format (kvplan's weight dtype names)."""
    if method == "mxfp4":
        return "mxfp4"
    if storage.weight_dtype == "F8_E4M3":
        return "fp8_e4m3"
    if storage.weight_dtype == "F8_E5M2":
        return "fp8_e5m2"
    if storage.label.startswith("NVFP4"):
        return "nvfp4"
    return f"int{storage.bits}"


# ---------------------------------------------------------------------------------------------
# module names

_SYNONYMS = (("block_sparse_moe", "mlp"), ("feed_forward", "mlp"), ("self_attention", "self_attn"),
             ("backbone", "model"), ("router", "gate"), ("language_model.model", "model"),
             ("model.language_model", "model"), ("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))


def _normalise(pattern: str) -> str:
    for name, canonical in _SYNONYMS:
        pattern = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", canonical, pattern)
    return pattern


def matches(module: str, pattern: str) -> bool:
    """Whether an ignore / target ``pattern`` names ``module`` (see the module doc for the three forms)."""
    if pattern.startswith("re:"):
        return re.match(_normalise(pattern[3:]), module) is not None
    p = _normalise(pattern)
    if any(c in p for c in "*?["):
        return fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, p + ".*")
    return f".{p}." in f".{module}."


# ---------------------------------------------------------------------------------------------
# reading quantization_config

_FP8 = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}


def read(config: Mapping[str, Any], where: str, model_dtype: str) -> Quantization | None:
    """The config's ``quantization_config`` (or ``compression_config``), None when it has none.

    ``model_dtype``: the safetensors name of the model dtype (``BF16``), what scales stored "in the model
    dtype" use. Raises :class:`ConfigError` naming the field for a value of the wrong type.
    """
    for key in ("quantization_config", "compression_config"):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: field {key} = {short_repr(value)} is invalid: expected a mapping")
        r = ConfigReader(value, where, key + ".")
        method = (r.str("quant_method", "") or "").lower().replace("_", "-")
        reader = _METHODS.get(method)
        if method == "modelopt" or (not method and r.has("quant_algo")):
            reader, method = _modelopt, "modelopt"
        if reader is None:
            return Quantization(method or "(none)", ())
        return reader(r, method, model_dtype)
    return None


def _patterns(r: ConfigReader, *keys: str) -> tuple[str, ...]:
    out: list[str] = []
    for key in keys:
        value = r.str_list(key)
        if value:
            for pattern in value:
                if pattern.startswith("re:"):
                    try:
                        re.compile(pattern[3:])
                    except re.error as exc:
                        raise r.fail(key, pattern, f"a valid regular expression ({exc})") from None
            out += value
    return tuple(out)


def _fp8(r: ConfigReader, method: str, model_dtype: str) -> Quantization:
    """DeepSeek-V3 / transformers' FineGrainedFP8 (``weight_block_size``) or per-tensor fp8."""
    fmt = (r.str("fmt", "e4m3") or "e4m3").lower()
    dtype = _FP8.get(fmt)
    if dtype is None:
        raise r.fail("fmt", fmt, "e4m3 or e5m2")
    block = r.int_list("weight_block_size")
    if block is not None:
        if len(block) != 2 or min(block) < 1:
            raise r.fail("weight_block_size", block, "two positive integers [rows, cols]")
        storage = Storage(f"fp8 {fmt} with one float32 scale per {block[0]}x{block[1]} block", dtype, 8, "F32",
                          (block[0], block[1]))
    else:
        static = r.str("activation_scheme", "dynamic") == "static"
        label = f"fp8 {fmt} with one float32 scale per tensor" + (" (+ a static input scale)" if static else "")
        storage = Storage(label, dtype, 8, "F32", (0, 0), per_tensor=("F32",) if static else ())
    return Quantization(method, (Rule(storage, ("decoder",)),),
                        _patterns(r, "modules_to_not_convert", "ignored_layers"))


def _mxfp4(r: ConfigReader, method: str, model_dtype: str) -> Quantization:
    """gpt-oss: the routed experts in MXFP4 (vLLM quantizes only the fused MoE layers with it)."""
    storage = Storage("MXFP4 experts (4 bits + one 8-bit exponent scale per 32 weights)", "U8", 4, "U8", (1, 32))
    return Quantization(method, (Rule(storage, ("experts",)),), _patterns(r, "modules_to_not_convert"))


def _gptq(r: ConfigReader, method: str, model_dtype: str) -> Quantization:
    """GPTQ (and AutoRound's GPTQ packing): ``bits`` packed in int32, one fp16 scale and one packed zero
    point per ``group_size`` inputs, an int32 ``g_idx`` per input column."""
    bits = r.int("bits", ("bits", "w_bit"), default=4)
    group = _group_size(r)
    storage = Storage(f"GPTQ {bits}-bit, {_group_label(group)} (+ fp16 scale and packed zero per group, int32 g_idx)",
                      "I32", bits, "F16", (1, group), zero_dtype="I32", per_column="I32")
    return Quantization(method, (Rule(storage, ("decoder",)),), _patterns(r, "modules_to_not_convert"))


def _awq(r: ConfigReader, method: str, model_dtype: str) -> Quantization:
    """AWQ: ``bits`` packed in int32, one fp16 scale (and packed zero point) per ``group_size`` inputs."""
    bits = r.int("bits", ("bits", "w_bit"), default=4)
    group = _group_size(r, ("group_size", "q_group_size"))
    zero = r.bool("zero_point", True)
    label = f"AWQ {bits}-bit, {_group_label(group)} (+ fp16 scale{' and packed zero' if zero else ''} per group)"
    storage = Storage(label, "I32", bits, "F16", (1, group), zero_dtype="I32" if zero else None)
    return Quantization(method, (Rule(storage, ("decoder",)),), _patterns(r, "modules_to_not_convert"))


def _group_size(r: ConfigReader, keys: tuple[str, ...] = ("group_size",)) -> int:
    """Inputs per scale (0: one group for the whole row, which GPTQ and AWQ configs write as -1, as vLLM and
    transformers read it); 0 or another negative is an error (vLLM divides by it or rejects the shapes)."""
    for key in keys:
        value = r.raw(key)
        if value == -1 and not isinstance(value, bool):
            return 0
        if value is not None:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 1:
                raise r.fail(key, value, "a positive integer, or -1 for one group per row")
            return r.int("group_size", (key,)) or 0
    return 128


def _group_label(group: int) -> str:
    return f"group {group}" if group else "one group per row"


def _bitsandbytes(r: ConfigReader, method: str, model_dtype: str) -> Quantization:
    """bitsandbytes as transformers applies it: every linear layer but the LM head."""
    if r.bool("load_in_4bit") or r.raw("_load_in_4bit") is True:
        double = r.bool("bnb_4bit_use_double_quant")
        kind = r.str("bnb_4bit_quant_type", "fp4") or "fp4"
        storage = Storage(f"bitsandbytes 4-bit {kind} (+ one {'8-bit' if double else 'float32'} absmax per 64 weights"
                          f"{', one float32 per 256 absmax' if double else ''})", "U8", 4,
                          "U8" if double else "F32", flat_block=64, second_scale=double)
    elif r.bool("load_in_8bit") or r.raw("_load_in_8bit") is True:
        storage = Storage("bitsandbytes 8-bit (int8 + one float32 scale per output row)", "I8", 8, "F32", (1, 0))
    else:
        return Quantization(method, ())
    return Quantization(method, (Rule(storage, ("linear_no_head",)),), _patterns(r, "llm_int8_skip_modules"))


def _fbgemm_fp8(r: ConfigReader, method: str, model_dtype: str) -> Quantization:
    storage = Storage("fp8 e4m3 with one float32 scale per output row", "F8_E4M3", 8, "F32", (1, 0))
    return Quantization(method, (Rule(storage, ("decoder",)),), _patterns(r, "modules_to_not_convert"))


def _modelopt(r: ConfigReader, method: str, model_dtype: str) -> Quantization:
    """NVIDIA ModelOpt exports: ``quant_algo`` FP8 (per-tensor scales) or NVFP4, ``exclude_modules``, and a
    ``kv_cache_quant_algo`` that vLLM follows under ``--kv-cache-dtype auto``."""
    inner = r.raw("quantization")
    if isinstance(inner, dict):
        r = ConfigReader(inner, r.where, r.prefix + "quantization.")
    algo = (r.str("quant_algo", "") or "").upper()
    if algo == "FP8":
        storage = Storage("fp8 e4m3 with float32 per-tensor weight and input scales", "F8_E4M3", 8, "F32", (0, 0),
                          per_tensor=("F32",))
    elif algo == "NVFP4":
        group = r.int("group_size", ("group_size",), default=16)
        storage = Storage(f"NVFP4 (4 bits + one fp8 scale per {group} weights + float32 global scales)", "U8", 4,
                          "F8_E4M3", (1, group), per_tensor=("F32", "F32"))
    else:
        return Quantization(f"modelopt {algo or '(no quant_algo)'}", (), kv_cache=_modelopt_kv(r))
    exclude = _patterns(r, "exclude_modules", "ignore")
    targets = ("linear",) if exclude else ("linear_no_head",)
    return Quantization(method, (Rule(storage, targets),), exclude, _modelopt_kv(r))


def _modelopt_kv(r: ConfigReader) -> str:
    algo = r.raw("kv_cache_quant_algo")
    scheme = r.raw("kv_cache_scheme")
    if isinstance(algo, str) and algo.upper() == "FP8":
        return "fp8"
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float" \
            and scheme.get("dynamic") is False:
        return "fp8"
    return ""


def _compressed_tensors(r: ConfigReader, method: str, model_dtype: str) -> Quantization:
    """llm-compressor's ``config_groups`` (each: ``targets`` and a ``weights`` scheme), ``format``, ``ignore``."""
    groups = r.raw("config_groups")
    if groups is None:
        groups = {}
    if not isinstance(groups, dict):
        raise r.fail("config_groups", groups, "a mapping of group names to schemes")
    rules: list[Rule] = []
    default_format = r.str("format", "") or ""
    for name, group in groups.items():
        if not isinstance(group, dict):
            raise r.fail(f"config_groups.{name}", group, "a mapping")
        g = ConfigReader(group, r.where, f"{r.prefix}config_groups.{name}.")
        weights = g.raw("weights")
        if weights is None:
            continue  # activations only
        if not isinstance(weights, dict):
            raise g.fail("weights", weights, "a mapping")
        storage = _ct_storage(ConfigReader(weights, r.where, g.prefix + "weights."),
                              g.str("format", None) or default_format, model_dtype)
        if storage is not None:
            rules.append(Rule(storage, tuple(g.str_list("targets") or ["Linear"])))
    kv = r.raw("kv_cache_scheme")
    return Quantization(method, tuple(rules), _patterns(r, "ignore"), "scales" if isinstance(kv, dict) else "")


def _ct_group_size(w: ConfigReader, strategy: str) -> int:
    """compressed-tensors' ``group_size``: required and positive with the ``group`` / ``tensor_group``
    strategies (as compressed-tensors validates it); otherwise ignored, -1 (its spelling of per channel)
    or a positive integer."""
    value = w.raw("group_size")
    if strategy in ("group", "tensor_group"):
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value < 1):
            raise w.fail("group_size", value, f"a positive integer with strategy {strategy!r}")
        return w.int("group_size", ("group_size",)) or 0
    if value is not None and value != -1:
        w.int("group_size", ("group_size",))
    return 0


def _ct_storage(w: ConfigReader, fmt: str, model_dtype: str) -> Storage | None:
    """One compressed-tensors weight scheme as stored: float (fp8 / nvfp4) or int (packed / int8)."""
    bits = w.int("num_bits", ("num_bits",), default=8)
    kind = (w.str("type", "int") or "int").lower()
    strategy = (w.str("strategy", "tensor") or "tensor").lower()
    group = _ct_group_size(w, strategy)
    block = w.int_list("block_structure") or [128, 128]
    layout = {"tensor": (0, 0), "channel": (1, 0), "group": (1, group), "tensor_group": (1, group),
              "block": (block[0], block[-1])}.get(strategy)
    if layout is None:
        raise w.fail("strategy", strategy, "tensor, channel, group, tensor_group or block")
    where = {(0, 0): "per tensor", (1, 0): "per output row"}.get(layout, f"per {layout[0]}x{layout[1]}"
                                                               if layout[0] > 1 else f"per {layout[1]} weights")
    if kind == "float" and bits == 4:
        return Storage(f"NVFP4 (4 bits + one fp8 scale {where} + float32 global scales)", "U8", 4, "F8_E4M3",
                       layout, per_tensor=("F32", "F32"))
    if kind == "float" and bits == 8:
        return Storage(f"fp8 e4m3 with one scale {where}", "F8_E4M3", 8, model_dtype, layout)
    if kind != "int":
        raise w.fail("type", kind, "int or float")
    zero = None if w.bool("symmetric", True) else ("I32" if "pack" in fmt else "I8")
    if bits == 8 and "pack" not in fmt:
        return Storage(f"int8 with one scale {where}", "I8", 8, model_dtype, layout, zero_dtype=zero)
    return Storage(f"int{bits} packed in int32 with one scale {where}", "I32", bits, model_dtype, layout,
                   zero_dtype=zero, per_tensor=("I64", "I64"))


_METHODS = {"fp8": _fp8, "mxfp4": _mxfp4, "gptq": _gptq, "auto-round": _gptq, "awq": _awq,
            "bitsandbytes": _bitsandbytes, "fbgemm-fp8": _fbgemm_fp8,
            "compressed-tensors": _compressed_tensors}


# ---------------------------------------------------------------------------------------------
# stored bytes


def stored_elements(tensors: tuple[Tensors, ...] | list[Tensors], q: Quantization | None,
                    model_dtype: str) -> Counter[str]:
    """Elements per safetensors dtype of ``tensors`` as the checkpoint stores them (quantized ones by
    their :class:`Storage`, the rest in ``model_dtype`` or their own dtype)."""
    out: Counter[str] = Counter()
    for t in tensors:
        storage = q.storage(t) if q else None
        if storage is None:
            out[t.dtype or model_dtype] += t.parameters
        else:
            out.update(storage.elements(t))
    return out


def stored_bytes(elements: Mapping[str, int]) -> int:
    """Bytes of ``elements`` (per safetensors dtype)."""
    return sum(cdiv(n * SAFETENSORS_DTYPE_BITS[dtype], 8) for dtype, n in elements.items())


def quantized_parameters(tensors: tuple[Tensors, ...] | list[Tensors], q: Quantization) -> int:
    """Parameters of ``tensors`` that ``q`` stores quantized."""
    return sum(t.parameters for t in tensors if q.storage(t) is not None)
