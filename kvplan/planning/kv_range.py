"""The plan's range: its answer at the low and the high end of the KV budget's spread, built from the terms.

Each budget term kvplan estimates carries its own spread (:func:`kvplan.engines.spread.term_spread`, measured on
the calibration logs that print that term): the weights (by how they were counted), the activation peak (by model
family), non-torch memory (by tp and board), CUDA graphs (by release family) and what no log line prints (the
rest). The low end pays every term's downside (their sum): a KV budget that much lower. A term the user gives
(``--activation-gib``) has no spread; a term a calibration file measured keeps the logs' printed precision. Where
the engine's code path depends on its installation (vLLM 0.8 - 0.11's sampler; 0.10.1 - 0.11's MXFP4 layout on
Hopper) the low end pays the costlier path too; on a unified-memory device (GB10) the non-torch term takes the
widest spread of its neighbours; where no calibration log covers the platform x release family (vLLM V0 on ROCm)
the activation, non-torch and rest terms take the widest spread of their neighbours and the widest unexplained memory,
and a note says the class is unseen; and on a GeForce card under a release that charges other processes' memory the
low end allows for a desktop (topping up the non-torch spread); a note says why. An engine whose calibration logs
print no terms keeps the whole budget's spread per class (SGLang's print two, "Load weight end ... mem usage" and
the free memory before loading: once ``kv_spread.yaml`` has them, SGLang's range is built from its weights and
its memory in use before loading like vLLM's). The range
re-answers the same deployment (:class:`~kvplan.planning.answer.Deployment`, the same rules) with the blocks of
the budget less the downsides, and plus the upsides. A KV budget the user gives (``--kv-budget``) has no spread.
"""

from __future__ import annotations

from dataclasses import field, replace
from typing import Any

from kvplan import memory
from kvplan.engines import Budget, EngineDefaults, Term, given
from kvplan.engines.spread import (
    PRINTED_PRECISION_BYTES, ROUGH_WEIGHTS_FRACTION, ROUGH_WIDE_FAMILIES, UNSEEN_TERMS, TermSpread, board, covered, family, has_term_data,
    mode_covered, model_family, rough_weights, spread, term_class, term_spread, unseen_spread,
)
from kvplan.planning.answer import Answer, Deployment
from kvplan.units import GiB
from kvplan.frozen import frozen

# A desktop session (the compositor and a browser) on a GeForce card holds memory kvplan cannot see; releases whose
# profiler charges other processes' memory (EngineDefaults.charges_other_processes) give that much less KV. Not
# measured on the corpus (its consumer logs show none): an allowance the low end pays, said in a note.
DESKTOP_ALLOWANCE_BYTES = round(0.5 * GiB)
DESKTOP_NOTE = ("{release} charges memory other processes hold on the GPU as its own non-torch memory: a desktop on "
                "this {gpu} gives less KV by what it holds, which kvplan cannot know; the low end allows "
                "{allowance:.2f} GiB (check nvidia-smi's use before the engine starts)")
V0_ROOM_NOTE = ("{release} budgets its cache from total x gpu_memory_utilization ({usable:.2f} GiB) whatever else holds "
                "memory there, so the KV is the same, but the cache's allocation runs out of memory when what {who} "
                "holds exceeds {room:.2f} GiB, which kvplan cannot know")
STARTUP_NOTE = ("{release} refuses to start when less than total x gpu_memory_utilization ({usable:.2f} GiB) is free "
                "as it starts (\"Free memory on device ... is less than desired GPU memory utilization\"): what {who} "
                "holds then must stay under {room:.2f} GiB, which kvplan cannot know")
UNIFIED_NOTE = ("{gpu} shares its memory with the host: what vLLM finds free there moves with the host's use "
                "(cudaMemGetInfo counts system memory; 0.17+ reads psutil's available memory), and the non-torch "
                "memory it measures takes in what the host allocates meanwhile; kvplan cannot know it, so {what}")
UNIFIED_ALLOWED = ("the estimate allows {gib:.2f} GiB for it (the median gap of {logs} unified-memory start-up logs) "
                   "and the low end their widest, with the widest non-torch spread of its neighbours")
UNIFIED_UNMEASURED = "the low end takes the widest non-torch spread of its neighbours"


@frozen
class KvRange:
    """The answer at the low and high end of the KV budget's spread (bytes per GPU), where the spread came from,
    and each term's part of it (``terms``: the low end pays the sum of their ``over_bytes``).

    ``low`` and ``high`` are the plan's deployment with each end's blocks (``low_deployment``, ``high_deployment``)
    answering the plan's request (``context`` x ``batch`` at ``max_model_len``), answered when first read: the
    plans a sweep, a size search or a suggestion makes read few of them (two answers were a fifth of a plan).
    Where an end's blocks are the plan's own it is the plan's deployment, and its answer the plan's (``estimate``)."""

    kv_budget_low_bytes: int
    kv_budget_high_bytes: int
    source: str
    low_deployment: Deployment  # the plan's deployment with the low end's blocks (a report's rows ask it)
    high_deployment: Deployment
    terms: tuple[TermSpread, ...] = ()
    notes: tuple[str, ...] = ()
    request: tuple[int, int, int | None] = (0, 0, None)  # the plan's context, batch and fixed max_model_len
    estimate: Answer | None = field(default=None, compare=False, repr=False)  # the plan's answer, of `deployment`
    deployment: Deployment | None = field(default=None, compare=False, repr=False)
    _ends: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def low(self) -> Answer:
        """The answer at the low end (the KV budget less every term's downside)."""
        return self._answer(self.low_deployment)

    @property
    def high(self) -> Answer:
        """The answer at the high end (the KV budget plus every term's upside)."""
        return self._answer(self.high_deployment)

    def _answer(self, d: Deployment) -> Answer:
        if d is self.deployment and self.estimate is not None:
            return self.estimate
        hit = self._ends.get(id(d))
        if hit is None or hit[0] is not d:
            hit = self._ends[id(d)] = (d, d.answer(*self.request))
        return hit[1]

    @property
    def dominant(self) -> str:
        """The term whose downside is the largest part of the low end ("" for none)."""
        worst = max(self.terms, key=lambda t: t.over_bytes, default=None)
        return worst.term if worst is not None and worst.over_bytes > 0 else ""

    @property
    def summary(self) -> str:
        """The source in one short phrase for the answer panel: the budget's spread and the dominant term
        (``source`` and ``terms`` hold every term)."""
        worst = max(self.terms, key=lambda t: t.over_bytes, default=None)
        if worst is None or len(self.terms) == 1 or not worst.over_bytes:
            return self.source
        head = self.source.split(", the sum", 1)[0]
        return f"{head} from each term's spread; {worst.term} dominates (-{worst.over_bytes / GiB:.2f} GiB)"

    def to_dict(self) -> dict:
        def end(a: Answer, kv: int) -> dict:
            return {"kv_budget_bytes": kv, "num_blocks": a.num_blocks, "kv_tokens": a.kv_tokens,
                    "max_requests": a.max_requests, "max_concurrency": round(a.max_concurrency, 6),
                    "max_context_at_batch": a.max_context_at_batch, "fits": a.fits}
        return {"low": end(self.low, self.kv_budget_low_bytes), "high": end(self.high, self.kv_budget_high_bytes),
                "source": self.source, "dominant": self.dominant or None,
                "terms": {t.term: {"over_bytes": t.over_bytes, "under_bytes": t.under_bytes, "logs": t.logs,
                                   "basis": t.basis} for t in self.terms},
                "notes": list(self.notes)}


def _calibrated(term: Term) -> bool:
    return term.source.startswith("calibration")


UNSEEN_NOTE = ("no calibration log covers {release} on {platform}: kvplan's terms there are read in the code, not "
               "checked on a log that prints them, so the range takes each uncertain term's ({terms}) widest spread "
               "of its neighbours{widest}, never a narrow one")
PLATFORM_NAMES = {"rocm": "ROCm", "cuda": "CUDA"}
WIDEST_UNEXPLAINED = (" (non-torch memory: at least the widest unexplained memory of every class, since no family of "
                      "this engine mode is covered there)")


def unseen_platform(engine: EngineDefaults, gpu: Any) -> tuple[str, bool] | None:
    """The plan's platform (``ROCm``, ``CUDA``) where no calibration log that prints terms covers it for this release
    family (:func:`kvplan.engines.spread.covered`: vLLM V0 on ROCm today) and whether another family of its engine
    mode is covered there (:func:`~kvplan.engines.spread.mode_covered`), else None."""
    platform = gpu.device.platform if gpu is not None and hasattr(gpu, "device") else "cuda"
    name = family(engine.engine, engine.version)
    if covered(engine.engine, platform, name):
        return None
    return PLATFORM_NAMES.get(platform, platform), mode_covered(engine.engine, platform, name)


def term_spreads(budget: Budget, engine: EngineDefaults, tp: int, spec: Any = None, gpu: Any = None
                 ) -> tuple[tuple[TermSpread, ...], tuple[str, ...]]:
    """Each uncertain term's spread for this plan (engines whose logs print terms), and the notes it needs."""
    notes: list[str] = []
    kind = getattr(gpu, "memory_kind", "dedicated")
    brd = board(getattr(gpu, "interconnect", None), kind)
    if kind == "unified":
        host = term_spread("unified memory", engine.engine, "unified", 0)
        what = UNIFIED_ALLOWED.format(gib=budget.host_bytes / GiB, logs=host.logs) if host and budget.host_bytes \
            else UNIFIED_UNMEASURED
        notes.append(UNIFIED_NOTE.format(gpu=getattr(gpu, "name", "this GPU"), what=what))
    fam = model_family(spec) if spec is not None else "dense"
    rough = rough_weights(budget.weights.source)
    unseen = unseen_platform(engine, gpu)
    if unseen:
        notes.append(UNSEEN_NOTE.format(release=engine.label, platform=unseen[0], terms=", ".join(UNSEEN_TERMS),
                                        widest="" if unseen[1] else WIDEST_UNEXPLAINED))
    out: list[TermSpread] = []
    terms = (budget.weights, budget.activation, budget.overhead, budget.cudagraph)
    for t in terms:
        if t.name == "cudagraph" and t.bytes == 0 and not given(t):
            continue  # not subtracted by this release (or none)
        if given(t):
            if _calibrated(t):
                out.append(TermSpread(t.name, PRINTED_PRECISION_BYTES, PRINTED_PRECISION_BYTES, 1,
                                      "measured by the calibration (logs print 0.01 GiB)"))
            continue  # the user's figure stands
        cls = term_class(t.name, engine=engine.engine, version=engine.version, tp=tp, board_name=brd,
                         family_name=fam, rough=rough)
        formula = t.bytes - (budget.unlisted_weights_bytes if t.name == "weights" else 0)  # what the spread measures
        s = term_spread(t.name, engine.engine, cls, formula)
        if unseen and t.name in UNSEEN_TERMS:
            s = unseen_spread(t.name, engine.engine, cls, t.bytes, f"{cls} on {unseen[0]}", unseen[1]) or s
        if s is None:
            continue
        if t.name == "weights" and rough and fam in ROUGH_WIDE_FAMILIES and s.over_bytes < ROUGH_WEIGHTS_FRACTION * formula:
            s = replace(s, over_bytes=round(ROUGH_WEIGHTS_FRACTION * formula),
                        basis=s.basis + f"; at least {ROUGH_WEIGHTS_FRACTION:.0%} (counted from parameters x a dtype)")
        if t.name == "overhead" and kind == "unified":
            s = replace(s, basis=s.basis + "; unified memory: see the note")
        if t.name == "overhead" and budget.unmodelled_bytes:
            s = around_allowance(s, budget.unmodelled_bytes)
        if t.name == "weights" and budget.unlisted_weights_bytes:
            s = around_allowance(s, budget.unlisted_weights_bytes)
        out.append(s)
    rest = _rest_spread(terms, engine, tp, brd, fam, rough, unseen)
    if rest is not None:
        out.append(rest)
    if kind == "unified":
        host = host_spread(engine.engine, budget.host_bytes)
        if host is not None:
            out.append(host)
    out += _other_paths(budget)
    desk = desktop(budget, engine, gpu, sum(t.over_bytes for t in out if t.term == "overhead"))
    if desk is not None:
        out.append(desk[0])
        notes.append(desk[1])
    return tuple(out), tuple(notes)


def _other_paths(budget: Budget) -> list[TermSpread]:
    """What the low end pays for the engine's other ways of holding memory, where kvplan plans one: its costlier code
    path (``path_gap_bytes``) and vLLM V0's NVLS figure above the NCCL sizes V1 is planned with (``nvls_gap_bytes``)."""
    out = []
    if budget.path_gap_bytes:
        out.append(TermSpread("installation path", budget.path_gap_bytes, 0, 0,
                              "the engine's costlier code path where its installation lacks FlashInfer (vLLM 0.8 - "
                              "0.11's native sampler; a plain wheel's Marlin MXFP4 layout on Hopper)"))
    if budget.nvls_gap_bytes:
        out.append(TermSpread("NVLS buffers", budget.nvls_gap_bytes, 0, 0,
                              "vLLM V0's NVLS figure (288 MiB x tp per communicator, vllm#9699) above NCCL's own sizes, "
                              "which V1 is planned with"))
    return out


def _rest_spread(terms: tuple[Any, ...], engine: EngineDefaults, tp: int, brd: str, fam: str, rough: bool,
                 unseen: Any) -> TermSpread | None:
    """The spread of what no log line prints (the rest): the calibration's precision where it measured the printed
    terms, else the release family's class (an unseen platform's widest, see :func:`unseen_spread`)."""
    if all(_calibrated(t) for t in terms[:3]):
        return TermSpread("rest", PRINTED_PRECISION_BYTES, PRINTED_PRECISION_BYTES, 1,
                          "fitted by the calibration to the log's blocks")
    cls = term_class("rest", engine=engine.engine, version=engine.version, tp=tp, board_name=brd,
                     family_name=fam, rough=rough)
    seen = unseen_spread("rest", engine.engine, cls, 0, f"{cls} on {unseen[0]}", unseen[1]) if unseen else None
    return seen or term_spread("rest", engine.engine, cls, 0)


def host_spread(engine: str, host_bytes: int) -> TermSpread | None:
    """The spread of the host's use on a unified-memory device, around the ``host_bytes`` the point estimate already
    allows (:func:`kvplan.planning.budget.with_host_use`: the logs' median; 0 where it allows none; bytes per GPU,
    :func:`around_allowance`)."""
    host = term_spread("unified memory", engine, "unified", 0)
    if host is None:
        return None
    host = replace(host, basis=f"the host's use, which kvplan cannot know: {host.basis}")
    return around_allowance(host, host_bytes) if host_bytes else host


def around_allowance(s: TermSpread, allowed: int) -> TermSpread:
    """The spread ``s`` of a term kvplan cannot know (measured against its formula) around a point estimate that
    already allows ``allowed`` bytes more, the logs' median (the host's use, :func:`kvplan.planning.budget.with_host_use`;
    ROCm's non-torch memory, :func:`kvplan.planning.budget.with_unmodelled_non_torch`): the low end pays ``over``
    beyond it, the high end ``under`` plus it, so the range's ends stay where the logs put them."""
    return replace(s, over_bytes=max(0, s.over_bytes - allowed), under_bytes=s.under_bytes + allowed,
                   basis=f"{s.basis}; the estimate allows {allowed / GiB:.2f} GiB (the median)")


def desktop(budget: Budget, engine: EngineDefaults, gpu: Any, paid: int) -> tuple[TermSpread, str] | None:
    """The desktop allowance and its note, for a GeForce card under a release that charges other processes' memory
    (None elsewhere, or where the user gave the non-torch term): what the non-torch spread (``paid``, bytes) does
    not already allow of :data:`DESKTOP_ALLOWANCE_BYTES`, since that spread pays what the calibration logs'
    desktops held."""
    if getattr(gpu, "memory_kind", "dedicated") != "display" or not engine.charges_other_processes or \
            given(budget.overhead):
        return None
    term = TermSpread("desktop", max(0, DESKTOP_ALLOWANCE_BYTES - paid), 0, 0, "an allowance for a desktop on the "
                      f"card ({DESKTOP_ALLOWANCE_BYTES / GiB:.2f} GiB with the non-torch spread)")
    return term, DESKTOP_NOTE.format(release=engine.label, gpu=getattr(gpu, "name", "GPU"),
                                     allowance=DESKTOP_ALLOWANCE_BYTES / GiB)


def startup_note(budget: Budget, engine: EngineDefaults, gpu: Any) -> str | None:
    """The note for a device whose free memory other users share (unified memory: the host; a GeForce card: a
    desktop) under a vLLM V1 release that checks it at start-up (0.9.1+: v1/worker/gpu_worker.py ``init_device``
    raises when ``init_snapshot.free_memory < total x gpu_memory_utilization``; on GB10 the snapshot's free memory
    is the host's available memory), where a release that budgets from ``total x util`` gives the same KV whatever
    the others hold, but does not start when they hold more than ``total - usable``. None elsewhere (the releases
    that charge other processes' memory give less KV instead: :func:`desktop`). V0 from 0.6.5 makes no such check
    and allocates the cache it budgeted, which fails instead."""
    kind = getattr(gpu, "memory_kind", "dedicated")
    if kind not in ("unified", "display") or engine.mode not in ("V0", "V1") or engine.charges_other_processes:
        return None
    who = "the host" if kind == "unified" else "a desktop or any other process on the card"
    return (STARTUP_NOTE if engine.mode == "V1" else V0_ROOM_NOTE).format(release=engine.label, usable=budget.usable_bytes / GiB, who=who,
                               room=(budget.total_bytes - budget.usable_bytes) / GiB)


def _source(terms: tuple[TermSpread, ...]) -> str:
    over, under = sum(t.over_bytes for t in terms), sum(t.under_bytes for t in terms)
    parts = ", ".join(f"{t.term} -{t.over_bytes / GiB:.2f} ({t.basis})" for t in sorted(terms, key=lambda t: -t.over_bytes)
                      if t.over_bytes)
    return f"-{over / GiB:.2f} / +{under / GiB:.2f} GiB, the sum of each term's spread on real start-up logs: {parts}"


def kv_range(budget: Budget, engine: EngineDefaults, deployment: Deployment, answer: Answer, tp: int, context: int,
             batch: int, max_model_len: int | None, is_cpu: bool, spec: Any = None, gpu: Any = None) -> KvRange:
    """The range of ``answer`` (the plan's, at ``batch`` x ``context``) for a deployment of ``tp`` GPUs of ``gpu``
    (the plan's :class:`~kvplan.planning.plan.GpuInfo`) serving ``spec``."""
    kv, request = budget.kv_budget_bytes, (context, batch, max_model_len)
    kv_given = budget.kv_budget_source.startswith("--kv-budget")
    if is_cpu or kv_given:
        return KvRange(kv, kv, "the KV budget is given (--kv-budget)", deployment, deployment, request=request,
                       estimate=answer, deployment=deployment)
    notes: tuple[str, ...] = ()
    if has_term_data(engine.engine):
        terms, notes = term_spreads(budget, engine, tp, spec, gpu)
        source = _source(terms)
    else:
        s = spread(engine.engine, engine.version, tp)
        if s is None:
            return KvRange(kv, kv, "no measured spread for this engine", deployment, deployment, request=request,
                           estimate=answer, deployment=deployment)
        terms = (TermSpread("whole budget", s.over_bytes, s.under_bytes, s.logs, s.basis),)
        source = s.source
        rough = round(ROUGH_WEIGHTS_FRACTION * budget.weights.bytes) if rough_weights(budget.weights.source) else 0
        if rough:
            terms += (TermSpread("weights", rough, 0, 0, "counted from parameters and a dtype"),)
            source += (f"; the weights, counted from parameters and a dtype, may load {ROUGH_WEIGHTS_FRACTION:.0%} "
                       f"more ({rough / GiB:.2f} GiB)")
        if budget.path_gap_bytes:
            terms += (TermSpread("installation path", budget.path_gap_bytes, 0, 0, "the engine's costlier code path"),)
            source += f"; the low end pays the engine's costlier code path ({budget.path_gap_bytes / GiB:.2f} GiB)"
        desk = desktop(budget, engine, gpu, 0)
        if desk is not None:
            terms, notes = terms + (desk[0],), (desk[1],)
            source += f"; a desktop on the card ({desk[0].over_bytes / GiB:.2f} GiB)"
    start = startup_note(budget, engine, gpu)
    notes += (start,) if start else ()
    low_kv = kv - sum(t.over_bytes for t in terms)
    high_kv = kv + sum(t.under_bytes for t in terms)
    rng = KvRange(low_kv, high_kv, source, deployment_at(deployment, low_kv), deployment_at(deployment, high_kv),
                  terms, notes, request, answer, deployment)
    if rng.dominant:
        rng = replace(rng, source=rng.source + f"; {rng.dominant} dominates")
    return rng


def deployment_at(deployment: Deployment, kv_budget_bytes: int) -> Deployment:
    """``deployment`` with the blocks a KV budget of ``kv_budget_bytes`` per GPU holds (itself when they are its own)."""
    blocks = memory.num_blocks(kv_budget_bytes, deployment.demand.layout) if kv_budget_bytes > 0 else 0
    return deployment if blocks == deployment.blocks else replace(deployment, blocks=blocks)


__all__ = ["KvRange", "around_allowance", "deployment_at", "host_spread", "kv_range", "startup_note", "term_spreads"]
