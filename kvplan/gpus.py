"""The GPU catalogue: how much memory the runtime reports for each accelerator, and how fast it is.

The data lives in ``kvplan/data/gpus.yaml`` (read with :func:`kvplan.io.files.parse_bundled_yaml`). ``memory_bytes`` is the
total that ``torch.cuda.mem_get_info()[1]`` reports — what vLLM multiplies by
``gpu_memory_utilization`` — not the marketing "80 GB" and not nvidia-smi's total. Every number says
where it came from (``memory_source``), and says so plainly when it was derived rather than observed.

Names are forgiving: ``find_gpu("h100")``, ``find_gpu("H100-80GB")``, ``find_gpu("NVIDIA GeForce RTX
4090")`` all work; an unknown name raises :class:`GpuNotFoundError` whose hint lists the closest names.
For anything not in the catalogue, :func:`custom_gpu` builds an entry from a memory size. An engine log prints
the device's total, not its name: :func:`gpus_by_memory` finds the cards that report that total.

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError, GpuNotFoundError, InputError
from kvplan.frozen import frozen

DATA_FILE = Path(__file__).parent / "data" / "gpus.yaml"

# Words dropped when normalising a name: "NVIDIA GeForce RTX 4090" and "rtx4090" are the same key.
_VENDOR_WORDS = frozenset({"nvidia", "amd", "geforce", "tesla", "instinct", "radeon"})
# A memory-size token ("80GB", "80gib", "80g") is reduced to its number; "a10g" is not such a token.
_SIZE_TOKEN = re.compile(r"^(\d+)(?:gb|gib|g)$")
_SEPARATORS = re.compile(r"[\s\-_/]+")

_REQUIRED = ("name", "vendor", "marketing", "memory_bytes", "memory_source", "bandwidth_bytes_per_s", "bandwidth_source")
_OPTIONAL = ("marketing_gb", "fp16_tflops", "aliases", "is_cpu", "sm_count", "interconnect", "compute_capability",
             "memory_kind", "smi_memory_mib", "smi_memory_source", "node_gpus")
INTERCONNECTS = ("nvlink-switch", "nvlink", "pcie", "infinity-fabric")
# unified: the GPU's memory is the host's (GB10), what is free varies with it; display: a card that commonly drives
# a desktop (GeForce), whose compositor and applications hold some of its memory
MEMORY_KINDS = ("dedicated", "unified", "display")
_CAPABILITY = re.compile(r"^(\d+)\.(\d+)$")
# vLLM's CUDA platform supports bfloat16 from compute capability 8.0 (vllm/platforms/cuda.py supported_dtypes).
BF16_MIN_CAPABILITY = (8, 0)


@frozen
class Gpu:
    """One accelerator (or the ``cpu`` target) as kvplan plans for it.

    ``memory_bytes``: total memory of ONE device as the CUDA/HIP runtime reports it, in bytes
    (``None`` for the cpu target: the user gives it). ``bandwidth_bytes_per_s``: peak DRAM bandwidth
    in bytes per second (``None`` when unknown). ``fp16_tflops``: dense FP16/BF16 tensor peak in
    10**12 FLOP/s. ``marketing_gb``: the number on the box ("80" for "80 GB"). ``compute_capability``:
    the CUDA compute capability ``"major.minor"`` of NVIDIA parts (None for others).
    """

    name: str
    vendor: str
    marketing: str
    memory_bytes: int | None
    bandwidth_bytes_per_s: int | None
    memory_source: str
    bandwidth_source: str
    aliases: tuple[str, ...] = ()
    is_cpu: bool = False
    fp16_tflops: float | None = None
    marketing_gb: float | None = None
    sm_count: int | None = None  # streaming multiprocessors (AMD: compute units)
    interconnect: str | None = None  # one of INTERCONNECTS: how tp ranks on one board talk
    compute_capability: str | None = None
    smi_memory_mib: int | None = None  # the total nvidia-smi shows (MiB): what SGLang's defaults read
    smi_memory_source: str = ""
    node_gpus: int | None = None  # GPUs of this part one server holds (a datacenter part); None: not one
    memory_kind: str = "dedicated"  # one of MEMORY_KINDS

    @property
    def supports_bf16(self) -> bool:
        """Whether the engine can run bfloat16 here: NVIDIA from compute capability 8.0; AMD Instinct, the
        CPU backend and custom entries (assumed modern) yes."""
        match = _CAPABILITY.match(self.compute_capability or "")
        if match is None:
            return True
        return (int(match.group(1)), int(match.group(2))) >= BF16_MIN_CAPABILITY

    @property
    def memory_is_derived(self) -> bool:
        """True when ``memory_bytes`` was computed from other figures rather than observed."""
        return "DERIVED" in self.memory_source

    @property
    def is_custom(self) -> bool:
        """True for an entry built by :func:`custom_gpu` (not from the catalogue)."""
        return self.vendor == "custom"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (aliases as a list)."""
        data = asdict(self)
        data["aliases"] = list(self.aliases)
        return data


def normalize_gpu_name(text: str) -> str:
    """The lookup key for a GPU name: ``"NVIDIA H100 80GB HBM3"`` -> ``"h10080hbm3"``.

    Lower case; vendor words (nvidia, amd, geforce, tesla, instinct, radeon) dropped; a size token
    such as ``80GB``/``80GiB``/``80g`` reduced to ``80``; spaces, ``-``, ``_`` and ``/`` removed.
    """
    tokens = [t for t in _SEPARATORS.split(str(text).strip().lower()) if t]
    kept = []
    for token in tokens:
        if token in _VENDOR_WORDS:
            continue
        size = _SIZE_TOKEN.match(token)
        kept.append(size.group(1) if size else token)
    return "".join(kept)


# ---------------------------------------------------------------------------------------------
# loading and validating the data file


def _field_error(where: str, field: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: field '{field}' {message}", f"fix the GPU catalogue ({DATA_FILE.name})")


def _positive_int(record: dict[str, Any], field: str, where: str, *, allow_none: bool) -> int | None:
    value = record.get(field)
    if value is None:
        if allow_none:
            return None
        raise _field_error(where, field, "is required (an integer of bytes)")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _field_error(where, field, f"must be a positive integer, got {value!r}")
    return value


def _positive_number(record: dict[str, Any], field: str, where: str) -> float | None:
    value = record.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise _field_error(where, field, f"must be a positive number, got {value!r}")
    return float(value)


def _text(record: dict[str, Any], field: str, where: str) -> str:
    value = record.get(field)
    if not isinstance(value, str) or not value.strip():
        raise _field_error(where, field, f"must be a non-empty string, got {value!r}")
    return value.strip()


def _parse_record(record: Any, index: int, source: str) -> Gpu:
    where = f"{source}: gpus[{index}]"
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a mapping of fields, got {type(record).__name__}")
    if isinstance(record.get("name"), str):
        where = f"{where} ({record['name']})"
    for field in _REQUIRED:
        if field not in record:
            raise _field_error(where, field, "is missing")
    unknown = sorted(set(record) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise _field_error(where, unknown[0], f"is not a known field (known: {', '.join(_REQUIRED + _OPTIONAL)})")
    is_cpu = record.get("is_cpu", False)
    if not isinstance(is_cpu, bool):
        raise _field_error(where, "is_cpu", f"must be true or false, got {is_cpu!r}")
    aliases = record.get("aliases", [])
    if aliases is None:
        aliases = []
    if not isinstance(aliases, list) or not all(isinstance(a, (str, int)) and not isinstance(a, bool) for a in aliases):
        raise _field_error(where, "aliases", f"must be a list of names, got {aliases!r}")
    return Gpu(
        name=_text(record, "name", where),
        vendor=_text(record, "vendor", where),
        marketing=_text(record, "marketing", where),
        memory_bytes=_positive_int(record, "memory_bytes", where, allow_none=is_cpu),
        bandwidth_bytes_per_s=_positive_int(record, "bandwidth_bytes_per_s", where, allow_none=True),
        memory_source=_text(record, "memory_source", where),
        bandwidth_source=_text(record, "bandwidth_source", where),
        aliases=tuple(str(a) for a in aliases),
        is_cpu=is_cpu,
        fp16_tflops=_positive_number(record, "fp16_tflops", where),
        marketing_gb=_positive_number(record, "marketing_gb", where),
        sm_count=_positive_int(record, "sm_count", where, allow_none=True),
        interconnect=_interconnect(record, where),
        compute_capability=_capability(record, where),
        smi_memory_mib=_positive_int(record, "smi_memory_mib", where, allow_none=True),
        smi_memory_source=str(record.get("smi_memory_source") or ""),
        node_gpus=_positive_int(record, "node_gpus", where, allow_none=True),
        memory_kind=_memory_kind(record, where),
    )


def _interconnect(record: dict[str, Any], where: str) -> str | None:
    value = record.get("interconnect")
    if value is not None and value not in INTERCONNECTS:
        raise _field_error(where, "interconnect", f"must be one of {', '.join(INTERCONNECTS)}, got {value!r}")
    return value


def _memory_kind(record: dict[str, Any], where: str) -> str:
    value = record.get("memory_kind", "dedicated")
    if value not in MEMORY_KINDS:
        raise _field_error(where, "memory_kind", f"must be one of {', '.join(MEMORY_KINDS)}, got {value!r}")
    return value


def _capability(record: dict[str, Any], where: str) -> str | None:
    value = record.get("compute_capability")
    if value is None:
        return None
    if not isinstance(value, str) or not _CAPABILITY.match(value):
        raise _field_error(where, "compute_capability", f"must be a string \"major.minor\" such as \"8.0\", got {value!r}")
    return value


def parse_catalogue(data: Any, source: str = "gpus.yaml") -> tuple[Gpu, ...]:
    """Validate the loaded YAML (``{"gpus": [...]}``) and build the catalogue.

    Raises :class:`ConfigError` naming the entry and field for a missing field, a bad number, an
    unknown field, or a name/alias that (after :func:`normalize_gpu_name`) another GPU already uses.
    """
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ConfigError(f"{source}: expected a top-level 'gpus' list", "the catalogue file is `gpus: [...]`")
    gpus = tuple(_parse_record(record, i, source) for i, record in enumerate(data["gpus"]))
    owner: dict[str, str] = {}
    for index, gpu in enumerate(gpus):
        for label in (gpu.name, *gpu.aliases):
            key = normalize_gpu_name(label)
            if not key:
                raise _field_error(f"{source}: gpus[{index}] ({gpu.name})", "aliases", f"has an empty name {label!r}")
            if owner.setdefault(key, gpu.name) != gpu.name:
                raise _field_error(
                    f"{source}: gpus[{index}] ({gpu.name})", "aliases",
                    f"duplicate alias {label!r}: {key!r} already names {owner[key]}",
                )
    return gpus


@functools.lru_cache(maxsize=1)
def load_gpus() -> tuple[Gpu, ...]:
    """The bundled catalogue, in file order (cached after the first call)."""
    from kvplan.io.files import parse_bundled_yaml, read_text

    data = parse_bundled_yaml(read_text(DATA_FILE, "GPU catalogue"), str(DATA_FILE))
    return parse_catalogue(data, str(DATA_FILE))


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, Gpu]:
    return {normalize_gpu_name(label): gpu for gpu in load_gpus() for label in (gpu.name, *gpu.aliases)}


# ---------------------------------------------------------------------------------------------
# lookup


def find_gpu(name: str) -> Gpu:
    """Look a GPU up by name or alias, forgivingly (case, spaces, ``-``/``_``, ``GB`` suffixes).

    Raises :class:`GpuNotFoundError` with the closest catalogue names in its hint.
    """
    key = normalize_gpu_name(name)
    index = _index()
    if key in index:
        return index[key]
    closest: list[str] = []
    for match in closest_keys(key, list(index)):
        if index[match].name not in closest:
            closest.append(index[match].name)
    tail = "`kvplan gpus` lists them all; for any other GPU give its memory, e.g. --gpu-memory 24GiB"
    hint = f"closest: {', '.join(closest[:3])}; {tail}" if closest else tail
    raise GpuNotFoundError(f"unknown GPU {str(name)!r}", hint=hint)


def closest_keys(key: str, keys: list[str], cutoff: float = 0.4) -> list[str]:
    """``keys`` like ``key``, closest first: by similarity once a letter O among digits is read as a zero
    (``h1oo`` is ``h100``), names that begin with ``key``'s first character before those that do not (so
    ``H1OO`` gets the H100s, not ``cpu``)."""
    fixed = re.sub(r"o(?=[\do]*\d)|(?<=\d)o+", lambda m: "0" * len(m.group()), key) if any(c.isdigit() for c in key) else key
    import difflib  # here: only an unknown GPU name asks

    scored = [(difflib.SequenceMatcher(None, fixed, k).ratio(), k) for k in keys]
    kept = [(r, k) for r, k in scored if r >= cutoff]
    return [k for r, k in sorted(kept, key=lambda rk: (rk[1][:1] != fixed[:1], -rk[0]))]


# The same card reports a total that moves by a few tens of MiB with the driver and what else holds memory (an
# H100 80GB HBM3: 79.18 - 79.22 GiB in engine logs, 79.20 in the catalogue), and logs print it to 0.01 GiB.
MEMORY_MATCH_BYTES = 64 * 2**20


def gpus_by_memory(memory_bytes: int, *, vendor: str | None = None,
                   tolerance_bytes: int = MEMORY_MATCH_BYTES) -> tuple[Gpu, ...]:
    """The catalogue GPUs whose runtime-reported total is within ``tolerance_bytes`` of ``memory_bytes`` (what an
    engine log prints as the device's total), nearest first; only ``vendor``'s (``nvidia``, ``amd``) when given.
    Several cards share a size (A100 SXM and PCIe; H20 and any other 96 GB part): the first is the nearest, not
    a certainty."""
    near = [g for g in load_gpus() if g.memory_bytes is not None and abs(g.memory_bytes - memory_bytes) <= tolerance_bytes
            and (vendor is None or g.vendor == vendor)]
    return tuple(sorted(near, key=lambda g: abs(g.memory_bytes - memory_bytes)))


def custom_gpu(memory_bytes: int, name: str = "custom", bandwidth_bytes_per_s: int | None = None) -> Gpu:
    """A GPU that is not in the catalogue, from its runtime-reported total memory in bytes
    (what ``--gpu-memory 24GiB`` turns into) and optionally its bandwidth in bytes/s."""
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes <= 0:
        raise InputError(f"invalid GPU memory {memory_bytes!r}: must be a positive number of bytes", "e.g. --gpu-memory 24GiB")
    if bandwidth_bytes_per_s is not None and (
        isinstance(bandwidth_bytes_per_s, bool) or not isinstance(bandwidth_bytes_per_s, int) or bandwidth_bytes_per_s <= 0
    ):
        raise InputError(f"invalid GPU bandwidth {bandwidth_bytes_per_s!r}: must be a positive number of bytes/s")
    return Gpu(
        name=name,
        vendor="custom",
        marketing="given by the user",
        memory_bytes=memory_bytes,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        memory_source="given by the user (--gpu-memory)",
        bandwidth_source="given by the user" if bandwidth_bytes_per_s is not None else "unknown",
    )
