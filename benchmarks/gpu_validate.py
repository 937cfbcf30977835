"""Validate kvplan's estimates on a real GPU (one H200, < 8 minutes) and write a JSON summary.

    python benchmarks/gpu_validate.py results.json                      # CUDA, --gpu H200, default utilisation
    python benchmarks/gpu_validate.py out.json --device cpu --gpu cpu --gpu-memory 8GiB --kv-budget 0.25GiB

Scenarios (each: estimate vs measured pool bytes, fill to the planned concurrency, one more request,
paged-vs-contiguous attention on a sample; on CUDA also --probe: blocks that really fit in free memory):
  1. meta-llama/Llama-3.1-8B, bf16 KV, the engine's default gpu_memory_utilization
  2. the same with fp8 KV
  3. google/gemma-2-9b-it (sliding window 4096 + full attention, two groups sharing slots)
  4. deepseek-ai/DeepSeek-V2-Lite-Chat (MLA latent 576)
then a standalone paged attention suite at long context (GQA, MQA, MLA, sliding window, fp8) on the device.
Exit status 1 if any scenario fails. Nothing is downloaded: the models are kvplan's bundled specs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCENARIOS = [
    ("llama-3.1-8b-bf16", {"model": "meta-llama/Llama-3.1-8B"}),
    ("llama-3.1-8b-fp8", {"model": "meta-llama/Llama-3.1-8B", "kv_dtype": "fp8"}),
    ("gemma-2-9b-sliding", {"model": "google/gemma-2-9b-it"}),
    ("deepseek-v2-lite-mla", {"model": "deepseek-ai/DeepSeek-V2-Lite-Chat"}),
]


def run_scenario(name: str, values: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from kvplan.errors import KvplanError
    from kvplan.paged.validate import validate_plan
    from kvplan.planning.plan import estimate, options_from_values

    values = {**values, "gpu": args.gpu, "gpu_memory": args.gpu_memory, "kv_budget": args.kv_budget,
              "context": args.context}
    start = time.perf_counter()
    try:
        plan = estimate(options_from_values(values))
        result = validate_plan(plan, args.device, probe=args.device.startswith("cuda") and not args.no_probe)
    except KvplanError as exc:
        return {"name": name, "ok": False, "error": exc.one_line(), "seconds": time.perf_counter() - start}
    out = {"name": name, "ok": result.ok, "seconds": round(time.perf_counter() - start, 3),
           "plan": {"model": plan.spec.model_id, "gpu": plan.gpu.name, "gpu_memory_bytes": plan.gpu.memory_bytes,
                    "gpu_util": plan.engine.gpu_util, "kv_dtype": plan.kv_dtype, "block_size": plan.layout.block_size,
                    "kv_budget_bytes": plan.budget.kv_budget_bytes, "num_blocks": plan.answer.num_blocks,
                    "context": plan.answer.context, "max_requests": plan.answer.max_requests},
           "validation": result.to_dict()}
    return out


def attention_suite(device: str, tokens: int) -> list[dict[str, Any]]:
    """Paged vs contiguous decode at ``tokens`` tokens through scattered allocator tables on ``device``."""
    import torch

    from kvplan.paged.allocator import BlockAllocator, GroupSpec
    from kvplan.paged.attention import check_decode
    from kvplan.planning.serialize import to_jsonable

    bs = 16
    num_blocks = 2 * (tokens // bs) + 8
    sliding = 4096 if tokens > 8192 else tokens // 4  # a window shorter than the request: old blocks dropped
    cases = []
    for case, q_heads, kv_heads, dim, dtype, window in (
        ("gqa", 32, 8, 128, torch.bfloat16, None),
        ("gqa-fp8", 32, 8, 128, torch.float8_e4m3fn, None),
        ("mha", 16, 16, 128, torch.float16, None),
        ("mqa", 16, 1, 128, torch.bfloat16, None),
        (f"sliding({sliding})", 16, 8, 256, torch.bfloat16, sliding),
        ("mla", 16, 1, 576, torch.bfloat16, None),
    ):
        groups = [GroupSpec("sliding", window_tokens=window)] if window else [GroupSpec("full")]
        alloc = BlockAllocator(num_blocks, bs, groups, enable_prefix_caching=False)
        alloc.allocate("other", 1)
        alloc.allocate("req", 1)
        for step in range(1, tokens, bs):  # grow both in turn so the tables interleave
            alloc.append_tokens("req", min(bs, tokens - step))
            alloc.append_tokens("other", min(bs, tokens - step))
        alloc.append_tokens("req", 0)
        table = alloc.block_table("req")
        gen = torch.Generator(device=device).manual_seed(0)
        start = time.perf_counter()
        if case == "mla":
            latent = torch.zeros(num_blocks, bs, dim, dtype=dtype, device=device)
            check = check_decode(case, latent, None, table, tokens, bs, q_heads, value_dim=512, generator=gen)
            del latent
        else:
            kv = torch.zeros(2, num_blocks, bs, kv_heads, dim, dtype=dtype, device=device)
            check = check_decode(case, kv[0], kv[1], table, tokens, bs, q_heads, window=window, generator=gen,
                                 null_block=alloc.null_block)
            del kv
        cases.append({**to_jsonable(check), "seconds": round(time.perf_counter() - start, 3)})
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="where to write the JSON summary")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--gpu", default="H200", help="GPU to plan for (catalogue name; 'cpu' for vLLM's CPU backend)")
    parser.add_argument("--gpu-memory", default=None, help="override the GPU memory (e.g. 8GiB)")
    parser.add_argument("--kv-budget", default=None, help="explicit KV budget (default: the engine's utilisation)")
    parser.add_argument("--context", default="8k", help="tokens per request (default 8k)")
    parser.add_argument("--attention-tokens", type=int, default=None, help="tokens for the attention suite (default: 32768 on CUDA, 2048 on CPU)")
    parser.add_argument("--no-probe", action="store_true", help="skip the out-of-memory probe on CUDA")
    args = parser.parse_args(argv)

    from kvplan.paged.validate import require_torch, resolve_device

    torch = require_torch()
    args.device = resolve_device(args.device)
    tokens = args.attention_tokens or (32768 if args.device.startswith("cuda") else 2048)
    start = time.perf_counter()
    summary: dict[str, Any] = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda_total_bytes": int(torch.cuda.mem_get_info(args.device)[1]) if args.device.startswith("cuda") else None,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "scenarios": [],
    }
    for name, values in SCENARIOS:
        result = run_scenario(name, values, args)
        summary["scenarios"].append(result)
        m = (result.get("validation") or {}).get("measure") or {}
        print(f"{name:24s} {'ok' if result['ok'] else 'FAIL':4s} estimate {m.get('estimate_bytes', 0):>16,} B "
              f"measured {m.get('device_bytes', 0):>16,} B  {result['seconds']:.1f}s {result.get('error') or ''}", flush=True)
    summary["attention"] = attention_suite(args.device, tokens)
    for c in summary["attention"]:
        print(f"attention {c['case']:14s} {'ok' if c['ok'] else 'FAIL':4s} max|diff| {c['max_abs_error']:.2e}", flush=True)
    summary["ok"] = all(s["ok"] for s in summary["scenarios"]) and all(c["ok"] for c in summary["attention"])
    summary["seconds"] = round(time.perf_counter() - start, 3)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{'PASS' if summary['ok'] else 'FAIL'} in {summary['seconds']:.1f}s -> {args.out}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
