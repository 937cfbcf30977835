"""How close kvplan's engine model comes to what real vLLM / SGLang start-ups printed.

Runs ``kvplan.planning.plan.plan_for_spec`` on every report of ``benchmarks/engine_reports.yaml`` that names a
model kvplan can build and a GPU whose memory is known, and prints one row per report:

- ``reported``: the engine's capacity as logged (KV tokens, blocks x block size, the refusal's token
  count, the estimated max model length, or KV tokens derived from the printed "Available KV cache
  memory" GiB), next to kvplan's prediction from the inputs alone (``model``);
- ``+log terms``: the prediction again with every per-term number the log printed (weights,
  activation peak, non-torch, CUDA graphs) put in place of kvplan's estimate;
- ``gap from``: the term whose estimate differs most from the log (GiB, estimate minus log).

A gap is *explained* when substituting the logged terms closes it; ``unexplained`` is the error left
after that substitution. Reports that cannot be run are listed with the reason.

    PYTHONPATH=. python3 benchmarks/engine_agreement.py [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from kvplan.planning.plan import Options, plan_for_spec
from kvplan.model.sources import WeightFacts, load_bundled
from kvplan.model.spec import ModelSpec, build_spec, spec_from_config

GIB = 2**30
REPORTS = Path(__file__).with_name("engine_reports.yaml")


@dataclass(frozen=True)
class Case:
    """How to run one report: the model kvplan builds, the GPU, the modelled engine version."""

    model: str  # bundled id, or a key of INLINE_MODELS
    version: str
    gpu: str | None = None  # catalogue name; None: the report's total_memory_gib / gpu_memory_gib
    gpu_memory_gib: float | None = None  # when the report gives no total and the catalogue has no such GPU
    weights_dtype: str | None = None
    compare: str = "tokens"  # tokens | blocks | refusal | max_len | kv_gib | concurrency
    use_activation: bool = True  # False: the logged activation is another worker's (not the minimum)
    budget_from_log: bool = False  # True: kvplan cannot model the budget (EP, unknown GPU): block math only
    in_scope: bool = True  # False: a release older than the modelled ones (shown, not summarised)
    usage_context: str = "serve"  # "llm" when the report used the LLM class (other batch defaults)
    why: str = ""


# Minimal specs for models that are not bundled, built from the numbers the report itself states
# (engine_reports.yaml notes) plus the public config values named here.
INLINE_MODELS: dict[str, tuple[dict[str, Any], WeightFacts, str]] = {
    "Qwen3-14B": (
        {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 40,
         "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120,
         "intermediate_size": 17408, "vocab_size": 151936, "max_position_embeddings": 40960, "torch_dtype": "bfloat16"},
        WeightFacts(parameters=14_768_307_200, dtype="bfloat16"),
        "KV shape from the report (40 layers, 8 KV heads, 128 head dim); only the KV arithmetic is used",
    ),
    "gemma-7b": (
        {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "num_hidden_layers": 28,
         "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "hidden_size": 3072,
         "intermediate_size": 24576, "vocab_size": 256000, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"},
        WeightFacts(parameters=8_537_680_896, dtype="bfloat16"),
        "KV shape from the report (28 layers x 16 KV heads x 256); hidden/intermediate/vocab/params from the "
        "public gemma-7b config",
    ),
    "Qwen2.5-1.5B-Instruct": (
        {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 28,
         "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_size": 1536, "intermediate_size": 8960,
         "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True,
         "torch_dtype": "bfloat16"},
        WeightFacts(parameters=1_543_714_304, dtype="bfloat16"),
        "public Qwen2.5-1.5B-Instruct config; parameters from the report (1,548,989,952 - 5,275,648 LoRA); "
        "its KV blocks (5517 x 16 x 28,672 B = 2.357 GiB) confirm the KV shape",
    ),
}

CASES: dict[str, Case] = {
    "vllm-10517-3090-llama31-8b-20k": Case("meta-llama/Llama-3.1-8B-Instruct", "0.6", compare="blocks",
                                           why="V0 0.6.3/0.6.4 log format; total from the log"),
    "vllm-10517-3090-llama31-8b-29k-refused": Case("meta-llama/Llama-3.1-8B-Instruct", "0.6", compare="refusal",
                                                   why="V0 refusal: max_model_len > num_blocks x 16"),
    "vllm-12330-a100-40-llama3-8b": Case("meta-llama/Meta-Llama-3-8B", "0.6", compare="blocks",
                                         why="V0 0.6.5/0.6.6 (`vllm serve`)"),
    "vllm-pr10511-h100-llama3-8b-tp1": Case("meta-llama/Meta-Llama-3-8B", "0.6", compare="kv_gib",
                                            why="V0 main Dec 2024, `vllm serve`, max_model_len = 8192 (config)"),
    "vllm-21348-qwen3-235b-fp8-4xh100": Case("Qwen/Qwen3-235B-A22B", "0.10", gpu="H100-SXM-80GB", weights_dtype="fp8",
                                             why="V1 July 2025 (~0.9.2/0.10), serve defaults, fp8 weights"),
    "sglang-21348-qwen3-235b-fp8-4xh100": Case("Qwen/Qwen3-235B-A22B", "0.4", gpu="H100-SXM-80GB", weights_dtype="fp8",
                                               why="SGLang July 2025 (0.4.x formula), mem_fraction_static 0.93"),
    "lmcache-1739-qwen3-14b-v1": Case("Qwen3-14B", "0.10", gpu_memory_gib=80.0, compare="tokens", budget_from_log=True,
                                      why="GPU unknown (its memory does not matter here): block math from the "
                                          "logged KV GiB only"),
    "recipes-12-qwen3-coder-480b-fp8-8xh20-util-default": Case(
        "Qwen/Qwen3-Coder-480B-A35B-Instruct", "0.10.1.dev101+gbda9d0535", gpu_memory_gib=139.8, weights_dtype="fp8", compare="max_len",
        budget_from_log=True,
        why="dp 8 + expert parallel (not modelled): block math from the logged KV GiB; H20 141GB total derived "
            "from the two utilisations"),
    "recipes-12-qwen3-coder-480b-fp8-8xh20-util095": Case(
        "Qwen/Qwen3-Coder-480B-A35B-Instruct", "0.10.1.dev101+gbda9d0535", gpu_memory_gib=139.8, weights_dtype="fp8", compare="max_len",
        budget_from_log=True,
        why="as above, util 0.95"),
    "vllm-13061-2x4090-r1-distill-qwen-14b-refused": Case(
        "Qwen/Qwen2.5-14B-Instruct", "0.6", gpu_memory_gib=23.55, compare="refusal", use_activation=False,
        why="R1-Distill-Qwen-14B has Qwen2.5-14B's architecture; total 23.55 GiB = (8.69+13.95+0.25+0.19)/0.98; "
            "the logged activation is a non-driver worker's (no sampler), the refusal is the driver's minimum"),
    "vllm-9802-4xa100-llama31-8b-tp4": Case("meta-llama/Llama-3.1-8B", "0.6", gpu="A100-PCIe-80GB",
                                            compare="concurrency", why="V0 Oct 2024, chunked prefill on, 512 seqs"),
    "vllm-2418-4090-gemma-7b-refused": Case("gemma-7b", "0.6", gpu="RTX-4090-24GB", compare="refusal",
                                            in_scope=False, why="V0 Jan 2024 (0.2.x; modelled with the 0.6 profile); 4090 total "
                                                "varies 23.52-23.68 GiB by driver"),
    "myoceane-a100-gpt-oss-20b-v0190": Case("openai/gpt-oss-20b", "0.19.0", gpu="A100-SXM-80GB", compare="kv_gib",
                                            why="vLLM 0.19.0 `vllm serve` on an A100 80GB, util 0.65"),
    # Qwen2-7B-Instruct has Qwen2.5-7B-Instruct's tensors (same config numbers, 32,768 positions).
    "dennislee-a100-80-qwen2-7b-util025": Case("Qwen/Qwen2.5-7B-Instruct", "0.10.1.1", compare="tokens",
                                               why="vLLM 0.10.1.1 `vllm serve`, A100 80GB, util 0.25"),
    "dennislee-a100-80-qwen2-7b-util05": Case("Qwen/Qwen2.5-7B-Instruct", "0.10.1.1", compare="tokens",
                                              why="as above, util 0.5"),
    # The interconnect is an input (the catalogue's per GPU): these two ranks talk without NVLink, so the
    # PCIe entry of the same A100 is planned (same memory).
    "dennislee-2xa100-80-qwen2-7b-tp2": Case("Qwen/Qwen2.5-7B-Instruct", "0.10.1.1", gpu="A100-PCIe-80GB",
                                             compare="tokens", why="tp 2 on one node, no P2P (custom all-reduce off)"),
    "dennislee-2xa100-40-qwen2-7b-tp2-two-nodes": Case("Qwen/Qwen2.5-7B-Instruct", "0.10.1.1", gpu="A100-PCIe-40GB",
                                                       compare="tokens", why="tp 2 across two nodes (Ray), A100 40GB"),
    "dennislee-4xa100-80-gpt-oss-120b-tp4": Case("openai/gpt-oss-120b", "0.10.1.1", compare="kv_gib",
                                                 why="tp 4 across four nodes (Ray), MXFP4 checkpoint"),
    "xinyuwei-phi4-gptq-80gb-v0-llm": Case("microsoft/phi-4", "0.6", weights_dtype="int4", compare="blocks",
                                           usage_context="llm",
                                           why="LLM class, V0 0.6.5/0.6.6, GPTQ 4-bit checkpoint (int4 weights)"),
    "unsloth-grpo-t4-qwen25-15b-v072": Case("Qwen2.5-1.5B-Instruct", "0.7.2", compare="blocks", usage_context="llm",
                                            why="V0 0.7.2 LLM class on a T4, fp16, chunked prefill off"),
    # Third pass: a second H100 machine (vllm/vllm-openai:latest, 0.11+ DEBUG memory line, block size 128).
    # The image's version is not logged; its activation peaks (9.6 - 9.9 fp32 copies of rows x vocab) are the
    # native torch-sort sampler's, which the CUDA build runs by default from 0.12 to 0.16: modelled as 0.12.
    # These five rows calibrated the native path's 10 copies (in-sample).
    "h100-k8s-llama31-8b-tp1": Case("meta-llama/Llama-3.1-8B-Instruct", "0.12", gpu="H100-SXM-80GB", compare="kv_gib",
                                    why="`vllm serve` on an H100 (79.18 GiB), 0.11+ format"),
    "h100-k8s-gpt-oss-20b-tp1": Case("openai/gpt-oss-20b", "0.12", gpu="H100-SXM-80GB", compare="kv_gib", why="as above, MXFP4"),
    "h100-k8s-llama33-70b-fp8-tp2": Case("meta-llama/Llama-3.3-70B-Instruct", "0.12", gpu="H100-SXM-80GB", weights_dtype="fp8",
                                         compare="kv_gib", why="RedHatAI FP8-dynamic checkpoint, tp 2"),
    "h100-k8s-qwen3-32b-tp1": Case("Qwen/Qwen3-32B", "0.12", gpu="H100-SXM-80GB", compare="kv_gib", why="as above, tp 1"),
    "h100-k8s-qwen3-32b-tp2": Case("Qwen/Qwen3-32B", "0.12", gpu="H100-SXM-80GB", compare="kv_gib", why="as above, tp 2"),
    # DeepSeek-V2-Lite has the Chat release's architecture (MLA, 27 layers, 64 experts).
    "vllm-pr20665-4xl4-deepseek-v2-lite-tp2-pp2": Case(
        "deepseek-ai/DeepSeek-V2-Lite-Chat", "0.10", gpu="L4-24GB", compare="tokens",
        why="V1 main July 2025 (0.9.2 - 0.10), tp 2 x pp 2 on L4s, enforce-eager"),
    # R1-Distill-Qwen-14B has Qwen2.5-14B's architecture; the GPU (MI300X) is inferred from the budget.
    "rocm-blog-r1-distill-qwen-14b-tp2-v092": Case(
        "Qwen/Qwen2.5-14B-Instruct", "0.9.2.dev364+gb432b7a28", gpu="MI300X-192GB", compare="tokens",
        why="vLLM 0.9.2 on ROCm (native sampler, no FlashInfer), tp 2; MI300X inferred"),
    "rocm-blog-r1-distill-qwen-14b-tp2-v0111": Case(
        "Qwen/Qwen2.5-14B-Instruct", "0.11.1rc2.dev141+g38f225c2a", gpu="MI300X-192GB", compare="tokens",
        why="vLLM 0.11.1 on ROCm, tp 2; MI300X inferred"),
    "rocm-gemma-3-27b-it-v0110rc2": Case(
        "google/gemma-3-27b-it", "0.11.0rc2.dev98+g393de22d2", gpu="MI300X-192GB", compare="tokens",
        why="vLLM 0.11.0rc2 on ROCm, multimodal Gemma 3 (31 dummy images); MI300X inferred"),
    "eole-gemma-3-1b-it-v0130-llm": Case(
        "google/gemma-3-1b-it", "0.13.0", gpu_memory_gib=32.0, compare="tokens", budget_from_log=True,
        usage_context="llm", why="vLLM 0.13.0 LLM class, GPU not named: sliding-window block math from the logged GiB"),
}


def _spec(case: Case) -> ModelSpec:
    if case.model in INLINE_MODELS:
        config, weights, _ = INLINE_MODELS[case.model]
        return spec_from_config(config, model_id=case.model, where="engine_agreement.py", weights=weights)
    return build_spec(load_bundled(case.model))


def report_gpu(report: dict[str, Any], case: Case) -> str | None:
    """The catalogue GPU for a report: the case's, else the report's ``gpu`` field if the catalogue knows it.

    ``find_gpu`` knows marketing and torch device names ("A100-80GB", "NVIDIA A100-SXM4-80GB", "T4"). The
    catalogue entry gives the SM count and interconnect; a logged total (``total_memory_gib``) still wins
    over its memory (``_options`` passes both).
    """
    if case.gpu:
        return case.gpu
    name = str(report.get("gpu") or "")
    if not name or name.startswith("unknown"):
        return None
    from kvplan.errors import KvplanError
    from kvplan.gpus import find_gpu
    try:
        return find_gpu(name).name
    except KvplanError:
        return None


def _options(report: dict[str, Any], case: Case, spec: ModelSpec, **terms: int | None) -> Options:
    r = report.get("reported") or {}
    tp, pp = report.get("tp") or 1, report.get("pp") or 1
    max_model_len = report.get("max_model_len") or spec.max_position_embeddings
    gpu = report_gpu(report, case)
    total = r.get("total_memory_gib") or case.gpu_memory_gib
    gpu_memory = round(total * GIB) if total else None
    util = report.get("gpu_memory_utilization") if report["engine"] == "vllm" else report.get("mem_fraction_static")
    return Options(
        model=spec.model_id, gpu=gpu, gpu_memory_bytes=gpu_memory, gpu_count=tp * pp, usage_context=case.usage_context,
        tp=tp, pp=pp, engine=report["engine"], engine_version=case.version, weights_dtype=case.weights_dtype,
        gpu_util=util, context=max_model_len, max_model_len=max_model_len,
        max_num_seqs=report.get("max_num_seqs"), max_num_batched_tokens=report.get("max_num_batched_tokens"),
        block_size=report.get("block_size"),
        **{k: v for k, v in terms.items() if v is not None},
    )


def _logged_terms(report: dict[str, Any], case: Case) -> dict[str, float]:
    """Per-GPU terms the log printed (GiB)."""
    r = report.get("reported") or {}
    out: dict[str, float] = {}
    if r.get("weights_gib") is not None:
        out["weights"] = r["weights_gib"]
    if case.use_activation:
        if r.get("activation_peak_gib") is not None:
            out["activation"] = r["activation_peak_gib"]
        elif r.get("peak_torch_memory_gib") is not None and r.get("weights_gib") is not None:
            out["activation"] = r["peak_torch_memory_gib"] - r["weights_gib"]  # 0.6.3/0.6.4: peak includes weights
    if r.get("non_torch_gib") is not None:
        out["overhead"] = r["non_torch_gib"]
    if r.get("cudagraph_gib") is not None:
        out["cudagraph"] = r["cudagraph_gib"]
    return out


def _measure(plan: Any, case: Case) -> float:
    """The number comparable to the report's, from a plan."""
    a, lay = plan.answer, plan.layout
    if case.compare == "max_len":
        return a.longest_startable_len
    if case.compare in ("blocks", "refusal") or (case.compare == "tokens" and plan.engine.kv_tokens_rule == "blocks"):
        return a.num_blocks * lay.block_size
    if case.compare == "kv_gib":
        return plan.budget.kv_budget_bytes / GIB
    if case.compare == "concurrency":
        return a.max_concurrency * plan.max_model_len
    return a.kv_tokens


def _reported(report: dict[str, Any], case: Case) -> float | None:
    r = report.get("reported") or {}
    if case.compare == "blocks":
        return r["num_gpu_blocks"] * 16
    if case.compare == "refusal":
        return r["refusal_kv_tokens"]
    if case.compare == "max_len":
        return r["estimated_max_model_len"]
    if case.compare == "kv_gib":
        return r["available_kv_gib"]
    if case.compare == "concurrency":
        return r["max_concurrency"] * report["max_model_len"]
    return r.get("kv_cache_tokens")


@dataclass(frozen=True)
class Row:
    id: str
    engine: str
    compare: str
    reported: float | None
    model: float | None
    with_terms: float | None
    err_model: float | None
    err_final: float | None
    gap: str
    note: str
    in_scope: bool = True


def run_case(report: dict[str, Any], case: Case) -> Row:
    spec = _spec(case)
    r = report.get("reported") or {}
    base = _options(report, case, spec)
    model_plan = plan_for_spec(spec, base)
    logged = _logged_terms(report, case)
    n = base.tp * base.pp
    subs = {
        "weights_bytes": round(logged["weights"] * GIB) * n if "weights" in logged else None,
        "activation_bytes": round(logged["activation"] * GIB) if "activation" in logged else None,
        "overhead_bytes": round(logged["overhead"] * GIB) if "overhead" in logged else None,
        "cudagraph_bytes": round(logged["cudagraph"] * GIB) if "cudagraph" in logged else None,
    }
    b = model_plan.budget
    logged_kv = r.get("available_kv_gib")
    kv_plan = plan_for_spec(spec, replace(base, kv_budget_bytes=round(logged_kv * GIB))) if logged_kv else None
    if case.budget_from_log:  # the budget cannot be modelled here: check the block arithmetic from the log's
        assert kv_plan is not None
        model_value = final_value = _measure(kv_plan, case)
        gap = "KV budget from the log (block math only)"
    else:
        model_value = _measure(model_plan, case)
        estimates = {"weights": b.weights.bytes, "activation": b.activation.bytes, "overhead": b.overhead.bytes,
                     "cudagraph": b.cudagraph.bytes}
        if logged:
            deltas = {k: estimates[k] / GIB - v for k, v in logged.items()}
            ranked = sorted(deltas.items(), key=lambda kv: -abs(kv[1]))
            gap = f"{ranked[0][0]}: " + ", ".join(f"{k} {d:+.2f}" for k, d in ranked)
            if kv_plan is not None and case.use_activation and not {"activation", "overhead"} <= logged.keys():
                # the log names some terms but not all: its budget line says more than the substitution
                final_value = _measure(kv_plan, case)
                gap += f"; KV budget (sum of terms): {b.kv_budget_bytes / GIB - logged_kv:+.2f}, block math from the log's"
            else:
                final_value = _measure(plan_for_spec(spec, replace(base, **{k: v for k, v in subs.items()
                                                                            if v is not None})), case)
        elif kv_plan is not None:
            final_value = _measure(kv_plan, case)
            gap = f"KV budget (sum of terms): {b.kv_budget_bytes / GIB - logged_kv:+.2f}; log gives no per-term numbers"
        else:
            final_value = model_value
            gap = "no per-term numbers in the log"
    reported = _reported(report, case)

    def err(x: float | None) -> float | None:
        return None if x is None or not reported else (x - reported) / reported * 100

    return Row(report["id"], f"{report['engine']} {model_plan.engine.version}", case.compare, reported, model_value, final_value,
               err(model_value), err(final_value), gap, case.why, case.in_scope)


SKIP_REASONS = {
    "lmcache-1241-2x4090-qwen25-32b-fp8": "paraphrased by the reporter (not a log line); tp not stated",
    "lmcache-1241-2x4090-qwen3-30b-fp8": "paraphrased by the reporter (not a log line); tp not stated",
    "h100-k8s-gpt-oss-120b-tp1-inconsistent": "the write-up's row does not add up (71.26 - 64.38 - 7.38 - 0.13 < 0, "
                                              "logged KV 3.33 GiB): its activation / non-torch cells repeat another row's",
}


def skip_reason(report: dict[str, Any]) -> str:
    if report["id"] in SKIP_REASONS:
        return SKIP_REASONS[report["id"]]
    r = report.get("reported") or {}
    model = str(report.get("model", "unknown"))
    gpu = str(report.get("gpu", "unknown"))
    if model.startswith("unknown"):
        return "model not stated"
    if gpu.startswith("unknown") and not r.get("total_memory_gib"):
        return "GPU not stated"
    if not any(k in r for k in ("kv_cache_tokens", "num_gpu_blocks", "refusal_kv_tokens", "estimated_max_model_len",
                                "available_kv_gib", "max_concurrency", "max_total_num_tokens")):
        return "no KV capacity in the log (terms or settings only)"
    return f"model {model} not bundled and its architecture (hybrid / new) is not given in the report"


def rows() -> tuple[list[Row], list[tuple[str, str]]]:
    reports = yaml.safe_load(REPORTS.read_text())
    done, skipped = [], []
    for report in reports:
        case = CASES.get(report["id"])
        if case is None:
            skipped.append((report["id"], skip_reason(report)))
        else:
            done.append(run_case(report, case))
    return done, skipped


def _fmt(x: float | None, compare: str) -> str:
    if x is None:
        return "-"
    return f"{x:.2f} GiB" if compare == "kv_gib" else f"{x:,.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def summary(done: list[Row]) -> dict[str, float | int]:
    model = [abs(r.err_model) for r in done if r.err_model is not None and r.in_scope]
    final = [abs(r.err_final) for r in done if r.err_final is not None and r.in_scope]
    return {
        "reports_run": len(done),
        "reports_summarised": len(model),
        "median_abs_err_model_pct": statistics.median(model),
        "median_abs_err_final_pct": statistics.median(final),
        "over_10pct_model": sum(1 for e in model if e > 10),
        "over_10pct_unexplained": sum(1 for e in final if e > 10),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (for docs/engines.md)")
    args = parser.parse_args(argv)
    done, skipped = rows()
    out = sys.stdout
    if args.markdown:
        out.write("| report | engine | compares | reported | kvplan | err | + log terms | err | gap from (GiB, estimate - log) |\n")
        out.write("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
        for r in done:
            out.write(f"| {r.id} | {r.engine} | {r.compare} | {_fmt(r.reported, r.compare)} | {_fmt(r.model, r.compare)} | "
                      f"{_pct(r.err_model)} | {_fmt(r.with_terms, r.compare)} | {_pct(r.err_final)} | {r.gap} |\n")
    else:
        for r in done:
            out.write(f"{r.id:52} {r.engine:12} {r.compare:11} rep {_fmt(r.reported, r.compare):>12} "
                      f"kvplan {_fmt(r.model, r.compare):>12} {_pct(r.err_model):>8}  +terms "
                      f"{_fmt(r.with_terms, r.compare):>12} {_pct(r.err_final):>7}  {r.gap}\n")
    s = summary(done)
    out.write(f"\n{s['reports_run']} reports run, {s['reports_summarised']} in the modelled releases; median |error| {s['median_abs_err_model_pct']:.2f}% from the inputs "
              f"alone, {s['median_abs_err_final_pct']:.2f}% with the logged terms; over 10%: {s['over_10pct_model']} "
              f"from the inputs, {s['over_10pct_unexplained']} unexplained\n")
    for r in done:
        if r.err_model is not None and abs(r.err_model) > 10:
            scope = "" if r.in_scope else " [release older than the modelled ones]"
            out.write(f"- over 10% from the inputs: {r.id} ({r.err_model:+.1f}%){scope}: {r.gap}\n")
    out.write(f"\n{len(skipped)} reports skipped:\n")
    for rid, why in skipped:
        out.write(f"- {rid}: {why}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
