"""How sure kvplan is: each uncertain budget term's spread, measured on real start-ups.

``benchmarks/corpus_agreement.py --write-spread`` plans every start of the *calibration* part of the corpus of
real start-up logs (benchmarks/corpus/) from its inputs and, for every budget term a log prints (vLLM's
"Memory profiling takes ..." / "Actual usage is W for weight, A for peak activation, N for non-torch memory, and
C for CUDAGraph memory" lines), records how far the logged term rose above kvplan's estimate (``over``: kvplan
promised more KV) and fell below it (``under``), per class of that term (:data:`TERM_CLASSES`):

- ``weights``: by how kvplan counted them (a checkpoint's size, or parameters x a dtype - apart for hybrid and
  multimodal models, whose quantizers keep layers a 16-bit spec cannot name in 16 bits), as a fraction of the term;
- ``activation``: by model family (dense, MoE, vision, hybrid) and engine (vLLM V0 profiles one whole prefill,
  V1 a chunked batch), as a fraction of the term;
- ``overhead`` (non-torch memory): by tp and board (NVSwitch, NVLink, PCIe, Infinity Fabric, unified memory,
  unknown: a GPU given by its memory alone), GiB;
- ``cudagraph``: by release family, GiB (where the release subtracts it);
- ``rest``: what no line prints (the gap left when every term the release charges is put in), by release family;
- ``unified memory``: on a unified-memory device (GB10), all the gap its printed terms leave (what the host's use
  took from the free memory vLLM measures), GiB. kvplan cannot know the host's use, so the point estimate takes
  the class's median (``median_bytes``; :func:`kvplan.planning.budget.with_host_use`) and the range is measured
  around it.

The range's low end (:mod:`kvplan.planning.kv_range`) pays every estimated term's ``over`` (a term the user or a
calibration gives pays none); a class with fewer than :data:`MIN_TERM_LOGS` logs takes the widest of itself and
its neighbours (:func:`term_spread`), never a narrow one. One activation log far above the rest of a well-measured
class is set aside (:data:`OUTLIER_FACTOR`; named in the file and the basis), so that it neither sets its class's
spread nor reaches every class that borrows from it. vLLM V0 on ROCm, whose non-torch memory (hipBLASLt's) kvplan
does not model and no calibration log prints, pays the widest unexplained memory of every class
(:func:`widest_unexplained`). An engine whose logs print no terms (SGLang) keeps the
whole budget's spread per class (engine, release family, tp; :func:`spread`), falling back to its release family,
then to the engine. A platform x release family no calibration log that prints terms covers (``covered`` in the file,
:func:`covered`; vLLM V0 on ROCm) is unseen: its activation, non-torch memory and rest take the widest of their class's
neighbours (non-torch memory at least the widest unexplained memory of every class; :func:`unseen_spread`), and the
range says so.

The data lives in ``kvplan/data/kv_spread.yaml``; this module only reads it (once, lazily).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from kvplan.engines import release_tuple
from kvplan.units import GiB
from kvplan.frozen import frozen

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "kv_spread.yaml"
MIN_LOGS = 8
MIN_ENGINE_LOGS = 3  # an engine with fewer calibration logs than MIN_LOGS still gets its engine-wide spread
# A weights term counted from the parameters and a weights dtype (no checkpoint size: --weights-dtype on a 16-bit
# spec) is rough where the quantizer leaves layers the spec cannot name in 16 bits: hybrid and multimodal models'
# checkpoints keep their linear-attention / state projections, gates and vision tower unquantized, and calibration
# logs load 13 - 17% more than the estimate (vllm-f33676930891, an fp8 Qwen3-Next; vllm-f51900802258, an NVFP4
# Qwen3.6): the low end allows at least this much more of it there. A dense or MoE transformer's quantized checkpoint
# quantizes every decoder linear layer (the embeddings and LM head kept, as kvplan counts them): its calibration logs
# load at most 0.9% more (fp8, AWQ, GPTQ, bitsandbytes, GGUF), its own class.
ROUGH_WEIGHTS_FRACTION = 0.15
ROUGH_WIDE_FAMILIES = ("hybrid", "vision")
MIN_TERM_LOGS = 4  # a term class with fewer calibration logs takes the widest spread of itself and its neighbours
# Each term's spread: this quantile of the calibration logs' per-term gaps. 0.95, not 0.90: the low end adds the
# terms' spreads, and with 0.90 it held in only 87% of the calibration starts (0.95: 96%); chosen on the calibration
# part alone.
TERM_QUANTILE = 0.95
# One log does not set a class's spread alone: in a class of at least OUTLIER_MIN_LOGS calibration logs, a log
# whose term rose more than OUTLIER_FACTOR x the quantile of the others above kvplan's estimate (and by more than
# OUTLIER_MIN_OVER, in the term's unit) is set aside, named in kv_spread.yaml (``set_aside``) and in the basis.
# The case: vllm-12330 (Llama-3-8B, V0 0.6.5, A100-40GB) printed 9.37 GiB of activation where kvplan plans 1.22
# and where the same model and release printed 1.26 on an H100 (vllm-pr10511, the profiler's author's own check):
# its profiled batch is not in the excerpt, and it made the "dense, V0" spread 3x the estimate for every V0 plan and
# every class that borrows from it. Its low end missed that log anyway.
# Only the activation is a formula of the profiled batch, whose outlier says its inputs were not what the log
# states; non-torch memory and the unexplained rest vary with the installation (vllm-pr10511's 1.79 GiB at tp 1 is
# as real as the others' 0.1 - 0.3), so their widest log always counts.
OUTLIER_TERMS = ("activation",)
OUTLIER_MIN_LOGS = 8
OUTLIER_FACTOR = 3.0
OUTLIER_MIN_OVER = 0.25
PRINTED_PRECISION_BYTES = round(0.01 * GiB)  # logs print each term to 0.01 GiB: what a calibrated term keeps
# How each term's spread is measured: a "fraction" term's as a fraction of kvplan's estimate of it, a "GiB" term's
# in GiB per GPU.
TERM_UNITS = {"weights": "fraction", "activation": "fraction", "overhead": "GiB", "cudagraph": "GiB", "rest": "GiB",
              "unified memory": "GiB"}
WEIGHTS_CLASSES = ("checkpoint", "parameters x dtype", "parameters x dtype, hybrid or vision")
MODEL_FAMILIES = ("dense", "moe", "hybrid", "vision")
BOARDS = ("nvlink-switch", "nvlink", "pcie", "infinity-fabric", "unified", "unknown")
TP_BUCKETS = ("tp 1", "tp 2", "tp 4 - 8", "tp 16+")
FLOOR_BYTES = round(0.05 * GiB)  # the narrowest spread kept on either side (printed GiB figures are 0.01 precise)

# release families: the releases whose budget arithmetic is alike (first release, name)
FAMILIES: dict[str, tuple[tuple[tuple[int, int, int], str], ...]] = {
    "vllm": (((0, 6, 0), "V0 0.6 - 0.7"), ((0, 8, 0), "V1 0.8 - 0.10"), ((0, 11, 0), "V1 0.11 - 0.19"),
             ((0, 20, 0), "V1 0.20+")),
    "sglang": (((0, 3, 0), "0.3 - 0.4.7"), ((0, 4, 8), "0.4.8 - 0.5.2"), ((0, 5, 3), "0.5.3+")),
}


def family(engine: str, version: str) -> str:
    """The release family of ``version`` (a modelled release or any version it covers)."""
    release = release_tuple(version, engine)
    return next(name for first, name in reversed(FAMILIES[engine]) if release >= first) if release >= \
        FAMILIES[engine][0][0] else FAMILIES[engine][0][1]


def tp_bucket(tp: int) -> str:
    """``tp 1``, ``tp 2``, ``tp 4 - 8`` or ``tp 16+``: where non-torch memory differs most."""
    return "tp 1" if tp == 1 else "tp 2" if tp == 2 else "tp 4 - 8" if tp <= 8 else "tp 16+"


@frozen
class Spread:
    """How far the engine's KV budget per GPU may fall below (``over_bytes``) or rise above (``under_bytes``)
    kvplan's, and the class and number of logs it was measured on."""

    over_bytes: int
    under_bytes: int
    logs: int
    basis: str

    @property
    def source(self) -> str:
        """``-1.98 / +0.63 GiB: 90th percentiles of 20 real start-up logs (vllm, tp 1)`` (the logs: the calibration
        part of benchmarks/corpus; docs/engines.md)."""
        return (f"-{self.over_bytes / GiB:.2f} / +{self.under_bytes / GiB:.2f} GiB: 90th percentiles of "
                f"{self.logs} real start-up logs ({self.basis})")


@lru_cache(maxsize=1)
def _doc() -> dict[str, Any]:
    from kvplan.io.files import parse_bundled_yaml, read_text

    return parse_bundled_yaml(read_text(DATA_FILE), DATA_FILE) or {}


def _table() -> tuple[dict[str, Any], ...]:
    return tuple(_doc().get("classes") or ())


def _terms() -> tuple[dict[str, Any], ...]:
    return tuple(_doc().get("terms") or ())


def model_family(spec: Any) -> str:
    """``vision``, ``hybrid`` (state layers), ``moe`` or ``dense``: the activation term's class of ``spec``
    (a :class:`~kvplan.model.spec.ModelSpec`)."""
    if getattr(spec, "vision", None) is not None:
        return "vision"
    if any(layer.is_state for layer in getattr(spec, "layers", ())):
        return "hybrid"
    return "moe" if getattr(spec, "num_experts", 0) else "dense"


def board(interconnect: str | None, memory_kind: str | None = None) -> str:
    """The non-torch term's board: ``unified`` for a unified-memory device, else its interconnect; ``unknown``
    where the GPU is only a memory size (``--gpu-memory``): :func:`kvplan.engines.vllm.non_torch` plans it as
    NVLink, and its spread is the class's own where the corpus has enough such logs, else the widest of the boards
    at its tp."""
    return "unified" if memory_kind == "unified" else interconnect or "unknown"


def term_class(term: str, *, engine: str, version: str, tp: int, board_name: str, family_name: str,
               rough: bool) -> str:
    """The class of ``term`` for a deployment (see the module docstring)."""
    if term == "weights":
        return WEIGHTS_CLASSES[0] if not rough else WEIGHTS_CLASSES[2 if family_name in ROUGH_WIDE_FAMILIES else 1]
    if term == "activation":  # by model family and engine (vLLM V0 profiles one whole prefill; V1 chunks it)
        return f"{family_name}, {family(engine, version).split()[0]}"
    if term == "overhead":
        return _overhead_class(tp_bucket(tp), board_name)
    if term == "unified memory":
        return "unified"
    return family(engine, version)


def _overhead_class(bucket: str, board_name: str) -> str:
    """``tp 2, nvlink-switch``; at tp 1 no NCCL buffers exist, so the NVIDIA boards with their own memory are one
    class (``tp 1``), and only the platforms that charge other memory there have their own: unified memory
    (``tp 1, unified``) and ROCm (``tp 1, infinity-fabric``: hipBLASLt workspaces)."""
    pooled = bucket == "tp 1" and board_name not in ("unified", "infinity-fabric")
    return "tp 1" if pooled else f"{bucket}, {board_name}"


def _neighbours(term: str, engine: str, cls: str) -> list[str]:
    """The classes next to ``cls``: for non-torch memory the same tp on other boards and the same board at the
    tp buckets beside it; for a release family the families beside it; otherwise every other class. Where the
    neighbours hold fewer than :data:`MIN_TERM_LOGS` logs, :func:`term_spread` takes every class of the term
    (for non-torch memory at tp 1 every tp-1 class: :func:`_alike`)."""
    if term == "overhead":
        tp, _, brd = cls.partition(", ")
        i = TP_BUCKETS.index(tp) if tp in TP_BUCKETS else 0
        beside = [TP_BUCKETS[j] for j in (i - 1, i + 1) if 0 <= j < len(TP_BUCKETS)]
        same_tp = {_overhead_class(tp, b) for b in BOARDS if b != brd} - {cls}
        return sorted(same_tp) + [_overhead_class(t, brd or "nvlink") for t in beside]
    if term in ("cudagraph", "rest"):
        names = [name for _, name in FAMILIES.get(engine, ())]
        i = names.index(cls) if cls in names else -1
        return [names[j] for j in (i - 1, i + 1) if i >= 0 and 0 <= j < len(names)]
    if term == "unified memory":
        return []
    if term == "activation":  # the same model family on the other engine, the other families on its own
        fam, _, mode = cls.partition(", ")
        modes = sorted({name.split()[0] for _, name in FAMILIES.get(engine, ())})
        return [f"{fam}, {m}" for m in modes if m != mode] + [f"{f}, {mode}" for f in MODEL_FAMILIES if f != fam]
    return [c for c in WEIGHTS_CLASSES if c != cls]


def _alike(term: str, cls: str, other: str) -> bool:
    """Whether class ``other`` may lend ``cls`` its spread when ``cls`` borrows from every class of ``term``: any
    class, except that a tp-1 class of non-torch memory borrows only from tp-1 classes. No NCCL communicator exists
    on one GPU, so a tensor-parallel board's NCCL buffers (a Blackwell NVSwitch board's 1 GiB more than kvplan's
    rule) say nothing of a single GPU's memory; a tensor-parallel class holds what a single GPU holds and NCCL's
    buffers besides, so it borrows from every class."""
    return term != "overhead" or not _single_gpu(cls) or _single_gpu(other)


def _single_gpu(cls: str) -> bool:
    """Whether a non-torch class is a tp-1 one (``tp 1``, ``tp 1, unified``, ...)."""
    return cls.partition(",")[0] == "tp 1"


@frozen
class TermSpread:
    """How far one budget term may rise above (``over_bytes``: the engine gives less KV) or fall below
    (``under_bytes``) kvplan's estimate, per GPU, and the class and logs it was measured on."""

    term: str
    over_bytes: int
    under_bytes: int
    logs: int
    basis: str  # the class measured, e.g. "tp 2, nvlink-switch"; a fallback says so
    median_bytes: int = 0  # the class's own median gap (logged - kvplan's estimate; 0 where the class has no row)


def has_term_data(engine: str) -> bool:
    """Whether the calibration logs of ``engine`` print budget terms (else the whole budget's spread is used)."""
    return any(r.get("engine") == engine for r in _terms())


def term_spread(term: str, engine: str, cls: str, estimate_bytes: int) -> TermSpread | None:
    """The spread of ``term`` in class ``cls`` for an estimate of ``estimate_bytes`` (None: the corpus has no
    log of this engine that prints the term). A class with fewer than :data:`MIN_TERM_LOGS` logs (or none) takes
    the widest of itself and its neighbours, or of every class of the term where the neighbours hold fewer than
    :data:`MIN_TERM_LOGS` logs together or none of them that many alone (non-torch memory at tp 1: every tp-1 class,
    :func:`_alike`); its basis says so. ``median_bytes`` is the
    class's own median gap (logged - kvplan), in the term's unit scaled like the spread: a term whose point estimate
    is a constant takes it (:func:`kvplan.planning.budget.with_host_use`)."""
    rows = {r["class"]: r for r in _terms() if r.get("engine") == engine and r.get("term") == term}
    if not rows:
        return None
    own = rows.get(cls)
    if own is not None and int(own["logs"]) >= MIN_TERM_LOGS:
        aside = own.get("set_aside")
        chosen, basis = [own], f"{cls}, {own['logs']} logs" + (
            f" (one set aside as an outlier: {aside['log']})" if aside else "")
    else:
        near = [rows[c] for c in _neighbours(term, engine, cls) if c in rows]
        # too few neighbours, or none measured on MIN_TERM_LOGS logs of its own (each then holds little more than the
        # logs that sized its constant, whose gaps are small by construction): every class of the term
        thin = sum(int(r["logs"]) for r in near) < MIN_TERM_LOGS or all(int(r["logs"]) < MIN_TERM_LOGS for r in near)
        every = [r for c, r in rows.items() if c != cls and _alike(term, cls, c)]
        chosen = ([own] if own else []) + (every if thin else near)
        seen = f"{own['logs']} {'log' if own['logs'] == 1 else 'logs'}" if own else "no logs"
        widest = max(chosen, key=lambda r: float(r["over"]))
        whose = "" if widest is own else f": {widest['class']}, {widest['logs']} logs"
        basis = f"{cls}: {seen}, so the widest of {'every class' if thin else 'its neighbours'}{whose}"
    scale = estimate_bytes if TERM_UNITS[term] == "fraction" else GiB
    over = max(float(r["over"]) for r in chosen)
    under = max(float(r["under"]) for r in chosen)
    median = round(float(own.get("median") or 0.0) * scale) if own is not None else 0
    return TermSpread(term, round(over * scale), round(under * scale), sum(int(r["logs"]) for r in chosen), basis,
                      median)


# The GiB terms that hold memory no formula of kvplan's explains: where a platform charges memory kvplan knows it
# does not model and no calibration log prints it, the low end takes the widest of these (:func:`widest_unexplained`).
UNEXPLAINED_TERMS = ("overhead", "rest", "unified memory")


def widest_unexplained(engine: str, why: str) -> TermSpread | None:
    """The widest ``over`` of every class of :data:`UNEXPLAINED_TERMS` of ``engine``'s calibration logs, as a
    non-torch spread whose basis says ``why`` (None: no such log). For a class the corpus has not seen whose
    memory kvplan knowingly leaves out (vLLM V0 on ROCm: what hipBLASLt holds outside torch; its matmul workspace is
    32 MiB on gfx942, but the library's loaded kernels have no size in vLLM's, PyTorch's or hipBLASLt's code),
    never a narrow spread."""
    rows = [r for r in _terms() if r.get("engine") == engine and r.get("term") in UNEXPLAINED_TERMS]
    if not rows:
        return None
    widest = max(rows, key=lambda r: float(r["over"]))
    return TermSpread("overhead", round(float(widest["over"]) * GiB), round(float(widest["under"]) * GiB),
                      int(widest["logs"]), f"{why}, so the widest unexplained memory of every class: "
                      f"{widest['term']}, {widest['class']}, {widest['logs']} logs")


# The platform x release family pairs that no calibration log printing terms covers, for a spread file written
# before it recorded its coverage (kv_spread.yaml ``covered``): vLLM V0 on ROCm (every V0 log with terms is CUDA's).
UNSEEN_BEFORE_RECORDED = (("vllm", "rocm", "V0 0.6 - 0.7"),)
# The terms whose spread an unseen platform x release family widens: the engine's own memory on that platform
# (the activation's kernels, non-torch memory, what no line prints). The weights a checkpoint holds are the same bytes
# on every platform.
UNSEEN_TERMS = ("activation", "overhead", "rest")


def covered(engine: str, platform: str, family_name: str) -> bool:
    """Whether a calibration log that prints budget terms covers ``platform`` (``cuda``, ``rocm``) x release family
    ``family_name`` of ``engine`` (kv_spread.yaml's ``covered``; a file without it:
    :data:`UNSEEN_BEFORE_RECORDED`)."""
    rows = _doc().get("covered")
    if rows is None:
        return (engine, platform, family_name) not in UNSEEN_BEFORE_RECORDED
    return any(r.get("engine") == engine and r.get("platform") == platform and r.get("family") == family_name
               for r in rows)


def mode_covered(engine: str, platform: str, family_name: str) -> bool:
    """Whether any release family of the same engine mode as ``family_name`` (vLLM's ``V0`` / ``V1``; SGLang's
    families are one mode) is :func:`covered` on ``platform``: an uncovered family beside covered ones borrows from
    them; a platform whose whole mode is unseen (vLLM V0 on ROCm) does not."""
    mode = family_name.split()[0] if engine == "vllm" else ""
    return any(covered(engine, platform, name) for _, name in FAMILIES.get(engine, ())
               if not mode or name.split()[0] == mode)


def unseen_spread(term: str, engine: str, cls: str, estimate_bytes: int, why: str, mode_seen: bool = False
                  ) -> TermSpread | None:
    """The spread of ``term`` for a platform x release family no calibration log covers (:func:`covered`), never a
    narrow one: the widest of its own class and its neighbours (:func:`term_spread`'s neighbours), or of every
    class of the term where those hold fewer than :data:`MIN_TERM_LOGS` logs; for non-torch memory, where the
    platform's whole engine mode is unseen (not ``mode_seen``: :func:`mode_covered`), at least the widest unexplained
    memory of every class (:func:`widest_unexplained`). Its basis says the class is unseen and ``why``."""
    rows = {r["class"]: r for r in _terms() if r.get("engine") == engine and r.get("term") == term}
    near = [rows[c] for c in [cls, *_neighbours(term, engine, cls)] if c in rows]
    chosen = near if sum(int(r["logs"]) for r in near) >= MIN_TERM_LOGS else [
        r for c, r in rows.items() if _alike(term, cls, c)]
    candidates = []
    if chosen:
        widest = max(chosen, key=lambda r: float(r["over"]))
        scale = estimate_bytes if TERM_UNITS[term] == "fraction" else GiB
        candidates.append(TermSpread(term, round(float(widest["over"]) * scale),
                                     round(max(float(r["under"]) for r in chosen) * scale),
                                     sum(int(r["logs"]) for r in chosen),
                                     f"{why}: unseen, so the widest of {'its neighbours' if chosen is near else 'every class'}"
                                     f": {widest['class']}, {widest['logs']} logs"))
    if term == "overhead" and not mode_seen:
        wide = widest_unexplained(engine, f"{why}: unseen")
        candidates += [wide] if wide is not None else []
    return max(candidates, key=lambda t: t.over_bytes, default=None)


# The platforms whose non-torch memory kvplan's formula knowingly leaves out, its constants being NVIDIA's: ROCm, where
# PyTorch prefers hipBLASLt on gfx90a / gfx942 (MI200 / MI300), gfx950 from ROCm 6.5 and RDNA3 / RDNA4 from ROCm 6.3
# (aten/src/ATen/Context.cpp: other archs fall back to hipBLAS), and hipBLASLt loads the code objects of the GEMM
# kernels the profile run meets into device memory outside torch's allocator: memory the profile charges as
# non-torch (or, 0.6.0 - 0.6.3, in its free-memory drop) whose size is the installation's (its library, the shapes
# met), in no vLLM, PyTorch or hipBLASLt code kvplan can read. Where calibration logs of such a class print it, the
# point estimate takes their median (:func:`unmodelled_non_torch`); the range is measured around it.
# SGLang's overhead term is its memory in use before loading, when no GEMM has run: vLLM's alone.
UNMODELLED_NON_TORCH_PLATFORMS = (("vllm", "rocm"),)


def unmodelled_non_torch(engine: str, platform: str, cls: str) -> TermSpread | None:
    """The non-torch memory the point estimate adds for ``engine`` on ``platform`` in overhead class ``cls`` (bytes
    per GPU in ``median_bytes``): the class's own calibration median gap (logged - kvplan's formula) where the pair
    is one of :data:`UNMODELLED_NON_TORCH_PLATFORMS` and that median is positive, else None (no calibration log of
    the class prints non-torch memory: nothing is added, and the range pays the unseen class's widest spread)."""
    if (engine, platform) not in UNMODELLED_NON_TORCH_PLATFORMS:
        return None
    own = next((r for r in _terms() if r.get("engine") == engine and r.get("term") == "overhead"
                and r.get("class") == cls), None)
    median = round(float(own.get("median") or 0.0) * GiB) if own is not None else 0
    if median <= 0:
        return None
    return TermSpread("overhead", round(float(own["over"]) * GiB), round(float(own["under"]) * GiB), int(own["logs"]),
                      f"{cls}, {own['logs']} {'log' if int(own['logs']) == 1 else 'logs'}", median)


def rough_weights(source: str) -> bool:
    """Whether a weights term's source says it was counted from parameters x a dtype, not a checkpoint's size."""
    return "parameters x" in source and "checkpoint" not in source


def spread(engine: str, version: str, tp: int) -> Spread | None:
    """The spread of the class (engine, release family, tp), else of (engine, tp), else the engine's (None: no
    data); classes of fewer than :data:`MIN_LOGS` logs are skipped (the engine-wide row needs
    :data:`MIN_ENGINE_LOGS`)."""
    fam, bucket = family(engine, version), tp_bucket(tp)
    rows = [r for r in _table() if r.get("engine") == engine]
    passed: list[str] = []  # the classes skipped for too few logs, which the basis names
    for want_family, want_tp in ((fam, bucket), (None, bucket), (None, None)):
        least = MIN_LOGS if want_tp else MIN_ENGINE_LOGS  # the engine's own row: whatever it has, if anything
        name = ", ".join(x for x in (engine, want_family, want_tp) if x)
        row = next((r for r in rows if r.get("family") == want_family and r.get("tp") == want_tp), None)
        if row is not None and int(row.get("logs") or 0) >= least:
            basis = name + (f"; fell back from {'; '.join(passed)}" if passed else "")
            return Spread(max(FLOOR_BYTES, round(float(row["over_gib"]) * GiB)),
                          max(FLOOR_BYTES, round(float(row["under_gib"]) * GiB)), int(row["logs"]), basis)
        logs = int(row.get("logs") or 0) if row is not None else 0
        passed.append(f"{name} ({logs} {'log' if logs == 1 else 'logs'}, fewer than {least})")
    return None


__all__ = ["BOARDS", "FAMILIES", "MODEL_FAMILIES", "ROUGH_WEIGHTS_FRACTION", "Spread", "TERM_UNITS", "TermSpread",
           "UNMODELLED_NON_TORCH_PLATFORMS", "UNSEEN_TERMS", "board", "covered", "family", "has_term_data",
           "mode_covered", "model_family", "rough_weights", "spread", "term_class", "term_spread", "tp_bucket",
           "unmodelled_non_torch", "unseen_spread", "widest_unexplained"]
