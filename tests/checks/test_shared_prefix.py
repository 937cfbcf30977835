"""A prefix every request shares counts once in the verdict, not only in its own panel.

``kvplan estimate meta-llama/Llama-3.1-8B --gpu H100 --prefix-tokens 4k --batch 80`` said "80 x 8,192 tokens:
does NOT fit" and suggested ``--batch 54`` beside its own prefix panel's "54 -> 108 requests"; a capacity check
with ``prefix_tokens: 4k`` and ``concurrency: 80`` failed with "got 54". With prefix caching on, the answer's
requests, fits, margin and max context, the paging row, report rows and checks all count with one rule
(:meth:`kvplan.memory.Demand.batch_blocks`, asked through :meth:`kvplan.planning.answer.Deployment.batch_blocks`);
with it off, none of them credits the prefix, and each says which it is.

The rule is checked against the plain-Python allocator with prefix caching (an oracle: requests holding the
same prefix token ids), and as properties over every bundled spec.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from kvplan import memory
from kvplan.checks.capacity import evaluate
from kvplan.checks.rows import Pool, make_row
from kvplan.model.sources import bundled_ids, load_bundled
from kvplan.model.spec import build_spec
from kvplan.paged.allocator import BlockAllocator
from kvplan.paged.groups import allocator_groups, exact_layout
from kvplan.planning.plan import Options, Plan, plan_for_spec

sys.path.insert(0, str(Path(__file__).parents[1]))
from entry_point import kvplan  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B"
# (context, prefix): half, all of it (the last token is recomputed), not block-aligned, one block
SHAPES = ((8192, 4096), (4096, 4096), (2048, 1000), (1024, 16))


@lru_cache(maxsize=None)
def spec_of(model_id: str):  # noqa: ANN201
    return build_spec(load_bundled(model_id))


def _plan(model_id: str, **values: object) -> Plan:
    return plan_for_spec(spec_of(model_id), Options(model=model_id, **values))


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_the_quoted_plan_fits_with_the_prefix_stored_once():
    # 512 blocks per 8,192-token request, 4,096 // 16 = 256 of them the shared prefix: the first request holds 512,
    # each other 256: 1 + (27,792 - 512) // 256 = 107 requests; 80 of them hold 512 + 79 x 256 = 20,736 blocks
    p = _plan(LLAMA, gpu="H100", prefix_tokens=4096, batch=80)
    a = p.answer
    assert (a.num_blocks, a.blocks_per_request, a.shared_blocks) == (27_793, 512, 256)
    assert a.max_requests == p.prefix.max_requests_shared == 107 and a.unshared_requests == 54
    assert a.fits and a.fits_margin_blocks == 27_792 - 20_736 and a.fix is None
    text = _flat(kvplan("estimate", LLAMA, "--gpu", "H100", "--prefix-tokens", "4k", "--batch", "80").stdout)
    assert re.search(r"107 (\(\d+ - \d+\) )?concurrent requests \(", text) and "stored once (256 blocks; prefix caching on)" in text
    assert "80 x 8,192 tokens: fits" in text and "--batch 54" not in text
    off = _flat(kvplan("estimate", LLAMA, "--gpu", "H100", "--prefix-tokens", "4k", "--batch", "80",
                       "--no-prefix-caching").stdout)
    assert re.search(r"54 (\(\d+ - \d+\) )?concurrent requests \(", off) and "not shared: prefix caching is off" in off and "does NOT fit" in off
    assert "--prefix-caching" in off.split("try ", 1)[1]  # turning it on is one of the fixes


def test_a_capacity_check_credits_the_prefix_only_with_prefix_caching(tmp_path):
    (tmp_path / "c.yaml").write_text(f"defaults: {{model: {LLAMA}, gpu: H100, prefix_tokens: 4k}}\nchecks:\n"
                                     "  - {name: shared, require: {concurrency: 80}}\n"
                                     "  - {name: copied, prefix_caching: false, require: {concurrency: 80}}\n")
    r = kvplan("check", str(tmp_path / "c.yaml"), "--json")
    assert r.returncode == 1, r.stderr
    results = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert results["shared"]["passed"] and not results["copied"]["passed"]
    shared, copied = (results[n]["requirements"][0] for n in ("shared", "copied"))
    assert (shared["actual"], copied["actual"]) == (107, 54)
    assert "stored once" in shared["message"] and "not shared (prefix caching off)" in copied["message"]
    assert any("prefix_caching: true" in s for s in copied["suggestions"])


@pytest.mark.parametrize("context,prefix", SHAPES)
def test_batch_blocks_is_what_the_allocator_holds(context, prefix):
    """The oracle: n requests whose first ``prefix`` token ids are the same, allocated with prefix caching,
    hold exactly ``batch_blocks(n)`` blocks where every group keeps every token, never more elsewhere."""
    checked = 0
    for model_id in ("meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-V2-Lite-Chat", "google/gemma-2-9b-it",
                     "mistralai/Mistral-7B-v0.1", "openai/gpt-oss-20b", "Qwen/Qwen3-8B"):
        demand = _plan(model_id, gpu="H100", context=context).demand
        groups = allocator_groups(demand)
        for n in (1, 2, 5):
            planned = demand.batch_blocks(n, context, prefix)
            alloc = BlockAllocator(planned + 1, demand.layout.block_size, groups, enable_prefix_caching=True)
            for i in range(n):  # the prefix's ids, then ids of the request's own
                own = [(1 << 40) + (i << 20) + t for t in range(context - prefix)]
                assert alloc.allocate(i, list(range(prefix)) + own) is not None, (model_id, n)
            if exact_layout(demand.layout):
                assert alloc.num_used_blocks == planned, (model_id, n, alloc.num_used_blocks, planned)
            else:
                assert alloc.num_used_blocks <= planned, (model_id, n)
            checked += 1
    assert checked == 18


def test_batch_blocks_never_decreases_with_the_context():
    # the binary search of max_context needs it: a request shorter than the prefix shares its first tokens - 1
    demand = _plan(LLAMA, gpu="H100").demand
    for prefix in (16, 100, 4096):
        for batch in (1, 2, 7):
            held = [demand.batch_blocks(batch, t, prefix) for t in range(1, 5000, 7)]
            assert held == sorted(held), (prefix, batch)


@pytest.mark.parametrize("model_id", bundled_ids())
def test_every_figure_counts_the_shared_prefix_the_same_way(model_id):
    """Over every bundled spec, both engines and prefix caching on/off: the answer's requests equal the prefix
    section's (shared when credited, unshared when not) and the paging row's; max_requests fit and one more does
    not; the max context at that batch fits and one token more does not; a report row and a check say the same."""
    for engine in ("vllm", "sglang"):
        for context, prefix in SHAPES[:3]:
            for caching in (True, False):
                p = _plan(model_id, gpu="H100", engine=engine, context=context, prefix_tokens=prefix,
                          prefix_caching=caching)
                a, pre, d = p.answer, p.prefix, p.deployment
                where = (model_id, engine, context, prefix, caching)
                assert pre is not None and pre.credited == caching == bool(a.shared_prefix_tokens), where
                assert a.max_requests == (pre.max_requests_shared if caching else pre.max_requests_unshared), where
                assert a.max_requests == p.fragmentation.paged_max_requests, where
                assert a.unshared_requests == pre.max_requests_unshared, where
                assert a.shared_blocks == (pre.shared_blocks if caching else 0), where
                assert p.fragmentation.contiguous_max_requests <= a.max_requests, where
                n = a.max_requests
                if n >= 1:
                    assert d.fits(n, context), where
                    m = d.max_context(n)
                    assert m >= 1 and d.fits(n, m, m), where
                    if m < d.model_limit:
                        assert not d.fits(n, m + 1, m + 1), where
                    full = plan_for_spec(p.spec, replace(p.options, batch=n))
                    assert full.answer.fits and full.answer.max_context_at_batch == m, where
                assert not d.fits(n + 1, context), where
                row = make_row(Pool(p, {}), context, n + 1, None)
                assert (row.max_requests, row.fits) == (n, False), where
                outcome = evaluate("concurrency", n, p)
                assert outcome.passed and outcome.actual == n, where
                if caching and a.max_requests == a.pool_requests:
                    # the pool's own count, by the rule: the first request holds every block, each other its own
                    assert memory.max_sharing_requests(a.num_blocks, p.demand, context, prefix) == n, where
