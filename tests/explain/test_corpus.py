"""The corpus of real start-up logs (benchmarks/corpus/, format in its README) stays well-formed.

Every entry is an ``<id>.yaml`` + ``<id>.log`` pair; its curated ``kvplan:`` block says how the agreement
benchmark plans it (a bundled spec, a catalogue GPU or the logged total, the engine version when the log
states none, the figure compared) or why it is skipped. The split keeps every start of one source in one
part, and the llm-d-planner repository (reserved as an independent check) is never a source.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from kvplan.engines import sglang as sglang_engine
from kvplan.engines import vllm as vllm_engine
from kvplan.errors import KvplanError
from kvplan.gpus import find_gpu
from kvplan.model.sources import bundled_ids
from kvplan.options import Options

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "benchmarks" / "corpus"
sys.path.insert(0, str(REPO / "benchmarks"))
import corpus  # noqa: E402  (benchmarks/corpus.py: the split, and the entries read once for every test file)

PATHS = sorted(CORPUS.glob("*/*.yaml"))
IDS = [p.stem for p in PATHS]
ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

# Fields every entry has (the earlier evidence file's entries were brought in with these) ...
COMMON = ("id", "source", "engine", "engine_version", "engine_mode", "model", "gpu", "gpu_count", "tp", "pp", "dp",
          "flags", "reported", "notes", "origin", "kvplan")
# ... and what the README asks of every collected start.
COLLECTED = COMMON + ("source_kind", "source_repo", "source_path", "engine_version_evidence", "log_level", "platform",
                      "model_evidence", "gpu_evidence", "defaults", "features")
KVPLAN_KEYS = ("model", "model_note", "gpu", "gpu_note", "engine_version", "version_note", "usage_context", "options",
               "compare", "skip", "note", "terms_worker")
COMPARES = ("tokens", "blocks", "refusal", "max_len", "kv_gib", "concurrency")
OPTION_NAMES = {f.name for f in dataclasses.fields(Options)}
BUNDLED = set(bundled_ids())
BUDGET_FROM_LOG = "budget from the log"


def _load(path: Path) -> dict:
    entry = corpus.read_meta(path)
    assert isinstance(entry, dict), path
    return entry


ENTRIES = {p.stem: _load(p) for p in PATHS}


def _planned(entry: dict) -> bool:
    return not entry["kvplan"].get("skip")


def test_the_corpus_has_its_entries_and_ids_are_unique():
    assert len(PATHS) >= 250
    assert len(set(IDS)) == len(IDS)
    assert len({e["id"] for e in ENTRIES.values()}) == len(ENTRIES)


@pytest.mark.parametrize("eid", IDS)
def test_entry_is_well_formed(eid):
    entry = ENTRIES[eid]
    path = next(p for p in PATHS if p.stem == eid)
    assert entry["id"] == eid and ID.match(eid)
    assert entry["engine"] in ("vllm", "sglang") and path.parent.name == entry["engine"]
    required = COLLECTED if str(entry["origin"]).startswith("collected") else COMMON
    missing = [k for k in required if k not in entry]
    assert not missing, missing
    assert entry["engine_mode"] in ("V0", "V1", None)
    assert entry.get("source_kind", "issue") in ("issue", "pr", "discussion", "file", "page")
    assert entry.get("log_level", "INFO") in ("INFO", "DEBUG")
    assert entry.get("platform") in ("cuda", "rocm", "cpu", "xpu", "tpu", "other", None)
    assert isinstance(entry["flags"], dict) and isinstance(entry["reported"], dict)
    assert str(entry["source"]).strip()
    log = path.with_suffix(".log")
    assert log.is_file() and log.read_text(encoding="utf-8").strip(), "a non-empty .log beside the .yaml"


@pytest.mark.parametrize("eid", IDS)
def test_no_source_from_the_reserved_llm_d_planner(eid):
    entry = ENTRIES[eid]
    for key in ("source", "source_repo", "source_path", "notes"):
        text = str(entry.get(key) or "").lower()
        assert "llm-d-planner" not in text and "llm-d-incubation" not in text, key


@pytest.mark.parametrize("eid", IDS)
def test_kvplan_block(eid):
    entry = ENTRIES[eid]
    block = entry["kvplan"]
    assert isinstance(block, dict) and set(block) <= set(KVPLAN_KEYS), set(block) - set(KVPLAN_KEYS)
    assert "skip" in block and "model" in block and "gpu" in block
    if block["model"] is not None:
        assert block["model"] in BUNDLED, f"{block['model']} is not a bundled spec (`kvplan models`)"
    if block["gpu"] is not None:
        assert find_gpu(block["gpu"]).name == block["gpu"], "a catalogue name (`kvplan gpus`), not an alias"
    for key in ("model_note", "gpu_note", "version_note", "note"):
        assert block.get(key) is None or (isinstance(block[key], str) and block[key].strip())
    if block["skip"] is not None:
        assert isinstance(block["skip"], str) and len(block["skip"].strip()) >= 10, "a skip says why"
        return
    assert block["model"], "a planned entry names its bundled spec"
    assert block.get("usage_context") in ("serve", "llm")
    assert block.get("compare") in COMPARES
    assert set(block.get("options") or {}) <= OPTION_NAMES
    assert block.get("terms_worker") in (None, "other"), "terms_worker: other, or absent"
    # the version planned: the block's, else the log's; it must be one kvplan models (>= vLLM 0.6 / SGLang 0.4)
    logged = entry["engine_version"]
    if logged is None or str(logged).startswith("unknown"):
        assert block.get("engine_version"), "the log states no version: the block gives the era's release"
    version = str(block.get("engine_version") or logged)
    resolve = vllm_engine.resolve_version if entry["engine"] == "vllm" else sglang_engine.resolve_version
    try:
        resolve(version)
    except KvplanError as exc:
        pytest.fail(f"engine version {version!r}: {exc}")
    # the GPU's memory comes from the catalogue, the logged total, or (block arithmetic only) the logged budget
    r = entry["reported"]
    from_log = BUDGET_FROM_LOG in (block.get("gpu_note") or "")
    explicit = "kv_budget_bytes" in (block.get("options") or {})
    if block["gpu"] is None and not from_log and not explicit:
        assert r.get("total_memory_gib"), "gpu null: the logged total_memory_gib is planned"
    if from_log:
        budget = (r.get("available_kv_gib") if entry["engine"] == "vllm"
                  else r.get("kv_size_gb") or (r.get("k_size_gb") and r.get("v_size_gb")))
        assert budget is not None, "a budget from the log needs the logged KV budget"
    # the compared figure is one the log printed
    figure = {
        "tokens": ("kv_cache_tokens", "max_total_num_tokens"),
        "blocks": ("num_gpu_blocks",),
        "refusal": ("error", "refusal_kv_tokens", "kv_cache_tokens"),
        "max_len": ("estimated_max_model_len",),
        "kv_gib": ("available_kv_gib",),
        "concurrency": ("max_concurrency",),
    }[block["compare"]]
    assert any(r.get(k) is not None for k in figure), f"compare {block['compare']}: none of {figure} is logged"


def test_every_entry_has_a_kvplan_block_and_some_are_planned():
    planned = [e for e in ENTRIES.values() if _planned(e)]
    assert len(planned) >= 100
    assert {e["engine"] for e in planned} == {"vllm", "sglang"}


def test_the_split_keeps_each_source_in_one_part():
    parts: dict[str, set[str]] = defaultdict(set)
    for entry in ENTRIES.values():
        split = corpus.split_of(entry)
        assert split in corpus.SPLITS
        parts[corpus.source_key(entry["source"])].add(split)
    mixed = {key: sorted(p) for key, p in parts.items() if len(p) > 1}
    assert not mixed, mixed
    assert {s for p in parts.values() for s in p} == set(corpus.SPLITS)
