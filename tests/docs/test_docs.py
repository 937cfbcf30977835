"""Docs stay true: the worked example's numbers are kvplan's, the CLI reference is current."""

import subprocess
import sys
from pathlib import Path

from kvplan_names import resolve

import kvplan

REPO = Path(__file__).resolve().parents[2]
MATH = (REPO / "docs" / "math.md").read_text()


def n(x: int) -> str:
    return f"{x:,}"


def test_worked_example_matches_kvplan():
    p = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192)
    b, a = p.budget, p.answer
    expected = [p.kv_bytes_per_token_gpu, b.total_bytes, b.usable_bytes, b.weights.bytes, b.activation.bytes,
                b.overhead.bytes, b.cudagraph.bytes, b.kv_budget_bytes, p.layout.block_bytes, a.num_blocks,
                a.kv_tokens, b.kv_budget_bytes - a.num_blocks * p.layout.block_bytes]
    for value in expected:
        assert n(value) in MATH, f"{value:,} missing from docs/math.md"
    assert f"= {a.max_requests}   ({a.num_blocks - 1 - a.max_requests * 512} blocks spare)" in MATH
    assert f"{a.max_concurrency:.2f}x" in MATH
    fp8 = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192, kv_dtype="fp8")
    assert f"{n(fp8.answer.num_blocks)} blocks: {fp8.answer.max_requests} requests" in MATH
    pre = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192, prefix_tokens=2000).prefix
    assert f"= {pre.max_requests_shared} requests fit instead of {pre.max_requests_unshared}" in MATH
    frag = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=1000, max_model_len=32768).fragmentation
    assert f"so {frag.contiguous_max_requests} requests fit" in MATH and f"so {frag.paged_max_requests} requests fit" in MATH
    for batch in (1, 54):  # the roofline lines read as the CLI prints them ("<= 196 tokens/s", not 195)
        roof = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192, batch=batch).roofline
        assert f"{roof.step_seconds * 1e3:.2f} ms -> <= {roof.tokens_per_s:,.0f} tokens/s" in MATH


def test_cli_reference_and_readme_sample_are_current():
    # and every output block of docs/*.md (```text + `$ kvplan ARGS`: ci.md, explain.md, reports.md, simulate.md),
    # which the generator reruns on docs/examples (and docs/examples/mistakes)
    r = subprocess.run([sys.executable, str(REPO / "docs" / "gen_cli_reference.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_docs_name_no_internal_tracker_or_notes():
    # docs/engines.md said "issue 15" six times and docs/dev a "DESIGN.md §4": users know neither our tracker
    # nor our internal notes (upstream references such as vllm#2863 are public and stay)
    import re

    internal = re.compile(r"(?i)(?<![\w-])issues? #?\d+|\bDESIGN\.md\b|\bthis session\b|\bthe issue's\b")
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()[:80]}" for p in DOCS
             for i, line in enumerate(p.read_text().splitlines(), 1) if internal.search(line)]
    assert not found, found


def test_version_claims_match_the_engine_tables():
    # docs/ci.md credited its figures to "kvplan's vLLM 0.32 budget model" while the newest modelled release
    # is 0.29: every vLLM / SGLang version the docs name is one whose source was read, and what the docs say
    # the defaults are is what kvplan.engines says
    import re

    from kvplan.engines import sglang, vllm

    newest = {"vllm": vllm.NEWEST_CHECKED, "sglang": max(sglang.FIRSTS.values())}
    for p in DOCS:
        text = p.read_text()
        for m in re.finditer(r"(?i)\b(vllm|sglang)(?:-cpu)? v?(\d+)\.(\d+)(?:\.(\d+))?\b", text):
            version = tuple(int(x or 0) for x in m.groups()[1:])
            assert version <= newest[m[1].lower()], f"{p.relative_to(REPO)}: {m[0]} is newer than any release read"
        # "kvplan's vLLM 0.32 budget model": what kvplan models is one of its modelled releases
        for m in re.finditer(r"(?i)(?:kvplan's (vllm|sglang) (\d+\.\d+)|(vllm|sglang) (\d+\.\d+)(?:\.\d+)? (?:budget )?model\b)",
                             text):
            engine, version = (m[1] or m[3]).lower(), m[2] or m[4]
            modelled = vllm.VERSIONS if engine == "vllm" else sglang.VERSIONS
            assert version in modelled, f"{p.relative_to(REPO)}: {m[0]!r} is not a modelled release ({modelled})"
    engines = " ".join((REPO / "docs" / "engines.md").read_text().split())
    read = ".".join(map(str, vllm.NEWEST_CHECKED))
    assert f"({read}) get the newest rules" in engines
    assert f"models the newest release (`{vllm.DEFAULT_VERSION}`, \"{vllm.RANGES[vllm.DEFAULT_VERSION]}\")" in engines


def test_architecture_names_every_package_and_every_rule_exists() -> None:
    """docs/architecture.md describes each package of kvplan/ (and only those), and every function its rule
    tables name exists: a renamed function or a moved module fails here."""
    import re

    text = (REPO / "docs" / "architecture.md").read_text()
    packages = {p.parent.name for p in (REPO / "kvplan").glob("*/__init__.py")}
    described = set(re.findall(r"^\*\*`(\w+)/`\*\*", text, re.M))
    assert described == packages
    shared = {p.stem for p in (REPO / "kvplan").glob("*.py") if p.stem not in ("__init__", "__main__")}
    for name in shared:
        assert f"`{name}.py`" in text or f"`kvplan/{name}.py`" in text, name
    rules = text[text.index("## Where each rule lives"):]
    names = set(re.findall(r"`((?:memory|engines|planning|paged|model|explain|checks|sim|observe|io)(?:\.\w+)+)`", rules))
    assert len(names) > 60
    for dotted in sorted(names):
        resolve(dotted)
    # both engines have a column for every rule row of the side-by-side table
    side = rules[rules.index("### Each engine's rules, side by side"):]
    rows = [line for line in side.splitlines() if line.startswith("| ") and not line.startswith("| rule")]
    assert rows and all(line.count(" | ") == 2 for line in rows)
