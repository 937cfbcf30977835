"""Docs stay true: the worked example's numbers are kvplan's, the CLI reference is current."""

import subprocess
import sys
from pathlib import Path

import kvplan

REPO = Path(__file__).resolve().parents[1]
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
    # also docs/explain.md's example output (the generator reruns it on the same log)
    r = subprocess.run([sys.executable, str(REPO / "docs" / "gen_cli_reference.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
