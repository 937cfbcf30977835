"""vLLM as the sizing oracle, widened: a tiny config per decoder architecture, four settings each.

For every text-decoder ``model_type`` transformers knows whose causal-LM class vLLM 0.32's registry
serves, this builds a tiny config from transformers' defaults (``generate``: same cache shape per layer
-- KV heads at most 4, head_dim, window, chunk, layer pattern, state dims -- but few layers, a small
hidden size, MLP, vocabulary and expert count), probes vLLM's CPU backend on it
(``/work/shared/tools/vllm_cpu_kv.sh``, explicit 0.25 GiB KV budget, max_model_len 8192) at four
settings -- defaults, fp8 KV cache, ``max_num_batched_tokens`` 512, prefix caching off -- and caches
every probe with its config in ``benchmarks/vllm_sweep_results.json`` (committed). ``compare`` then
recomputes kvplan's side from that file alone (no vLLM, no transformers) and compares num_blocks,
block size, KV cache tokens and max concurrency exactly.

    python3 benchmarks/vllm_sweep.py generate            # needs transformers; writes the configs into the cache
    nice python3 benchmarks/vllm_sweep.py probe          # needs the vLLM CPU tool; probes what is not cached
    python3 benchmarks/vllm_sweep.py compare --write     # kvplan vs the cache -> benchmarks/vllm_oracle_results.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from doc_section import replace_section  # noqa: E402

RESULTS = REPO / "benchmarks" / "vllm_sweep_results.json"
TOOL = REPO.parent / "shared" / "tools" / "vllm_cpu_kv.sh"
VLLM_PYTHON = Path(os.environ.get("VLLM_CPU_VENV", "/tmp/vllmcpu")) / "bin" / "python"
BUDGET_GIB = 0.25
MAX_LEN = 8192
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {"kv_dtype": "auto", "extra": {}},
    "fp8 KV": {"kv_dtype": "fp8", "extra": {}},
    "mnbt 512": {"kv_dtype": "auto", "extra": {"max_num_batched_tokens": 512}},
    "no prefix caching": {"kv_dtype": "auto", "extra": {"enable_prefix_caching": False}},
}


# ---------------------------------------------------------------------------------------------
# generate (transformers)

# hybrids whose transformers default config is all state layers: (state name, attention name) in layer_types
ATTENTION_FREE_DEFAULTS = {"granitemoehybrid": ("mamba", "attention")}
# keys vLLM's config class for the type rejects as unknown keyword arguments
DROP_KEYS = {"dbrx": ("_name_or_path", "output_attentions")}
# fields real checkpoints carry that vLLM's model code reads but transformers' class does not declare
EXTRA_KEYS: dict[str, dict[str, Any]] = {
    "glm4_moe": {"head_dim": 128}, "glm4_moe_lite": {"first_k_dense_replace": 1}, "hy_v3": {"first_k_dense_replace": 1},
    "longcat_flash": {"mla_scale_q_lora": True, "mla_scale_kv_lora": True}, "minimax_m2": {"rotary_dim": 64},
}
BIGGER_BUDGET_GIB = 1.0  # when one request at MAX_LEN does not fit in BUDGET_GIB (vLLM refuses to start)


def vllm_architectures() -> set[str]:
    """Architectures vLLM's registry serves as text generation models, natively or through its
    Transformers backend (asked in vLLM's own venv)."""
    code = ("from vllm.model_executor.models import registry as r; import json; "
            "print(json.dumps(sorted(set(r._TEXT_GENERATION_MODELS) | set(r._TRANSFORMERS_SUPPORTED_MODELS))))")
    out = subprocess.run([str(VLLM_PYTHON), "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _period(seq: list[str]) -> int | None:
    for p in range(1, 9):
        if all(seq[i] == seq[i % p] for i in range(len(seq))):
            return p
    return None


def _kinds(config: Any) -> list[str]:
    from transformers.cache_utils import get_layer_types_and_kwargs

    return list(get_layer_types_and_kwargs(config)[0])


def _fields(cls: type) -> set[str]:
    import dataclasses

    return ({f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()) | set(
        cls.attribute_map or {})


def tiny_kwargs(base: Any) -> dict[str, Any]:
    """Keyword arguments that shrink ``base`` (a text config) without changing what a layer caches."""
    cls = type(base)
    fields = _fields(cls)
    def get(key: str) -> Any:
        try:
            return getattr(base, key, None)
        except Exception:  # noqa: BLE001 - per-layer attribute of a heterogeneous config
            return None

    kw: dict[str, Any] = {"vocab_size": 1024, "dtype": "bfloat16"}
    for key in ("intermediate_size", "ffn_hidden_size"):
        if key in fields and isinstance(get(key), int):
            kw[key] = 128
    for key, value in (("num_local_experts", 4), ("n_routed_experts", 4), ("num_experts", 4), ("moe_num_experts", 4),
                       ("num_experts_per_tok", 2), ("moe_topk", 2), ("n_group", 1), ("topk_group", 1),
                       ("moe_intermediate_size", 64), ("shared_expert_intermediate_size", 64),
                       ("n_shared_experts", 1), ("num_shared_experts", 1), ("first_k_dense_replace", 1)):
        if key in fields and isinstance(get(key), int) and not isinstance(get(key), bool):
            kw[key] = min(value, get(key)) if key.startswith(("n_shared", "num_shared", "first_k")) else value
    if "max_position_embeddings" in fields:
        kw["max_position_embeddings"] = 2 * MAX_LEN
    for key in fields:
        if key.endswith("_token_id") and isinstance(get(key), int) and get(key) >= 1024:
            kw[key] = None
    # layers: one or two periods of the default pattern
    kinds = _kinds(base)
    pattern = get("hybrid_override_pattern")
    if isinstance(pattern, str):
        kinds = list(pattern)
    period = _period(kinds) or 8
    layers = min(len(kinds), max(4, 2 * period) if period < 8 else period)
    if "num_layers" in fields and "num_hidden_layers" not in {f for f in fields if f != "num_layers"}:
        kw["num_layers"] = layers
    else:
        kw["num_hidden_layers"] = layers
    if isinstance(pattern, str):  # MoE blocks ('E') use a kernel vLLM's CPU build lacks (relu2 experts)
        kw["hybrid_override_pattern"] = pattern[:layers].replace("E", "-")
    types = get("layer_types")
    if "layer_types" in fields and "layer_types" not in (cls.attribute_map or {}) and isinstance(types, list) \
            and len(types) >= layers:
        kw["layer_types"] = list(types[:layers])
    if type(base).model_type in ATTENTION_FREE_DEFAULTS:  # give the hybrid its attention layers
        state, attention = ATTENTION_FREE_DEFAULTS[type(base).model_type]
        kw["layer_types"] = [attention if (i + 1) % 4 == 0 else state for i in range(layers)]
    shared = get("num_kv_shared_layers")
    if isinstance(shared, int) and shared > 0:  # Gemma 3n: keep the share of layers that reuse a cache
        kw["num_kv_shared_layers"] = max(1, round(layers * shared / len(kinds)))
    # attention width: at most 4 KV heads, 2 query heads per KV head, same head_dim
    if get("kv_lora_rank") is not None:
        kw.update({"num_attention_heads": 4, "hidden_size": 512})
        if "num_key_value_heads" in fields:
            kw["num_key_value_heads"] = 4
        if isinstance(get("q_lora_rank"), int):
            kw["q_lora_rank"] = min(get("q_lora_rank"), 256)
    elif (isinstance(get("num_attention_heads"), int) and not base.is_heterogeneous
          and not any(k.startswith(("mamba", "linear_")) for k in fields)):
        heads = get("num_attention_heads")
        kv = get("num_key_value_heads") or heads
        head_dim = get("head_dim") or get("hidden_size") // heads
        kv_small = min(kv, 4)
        kw["num_attention_heads"] = kv_small * min(heads // kv, 2)
        if "num_key_value_heads" in fields:
            kw["num_key_value_heads"] = kv_small
        if "head_dim" in fields:
            kw.update({"head_dim": head_dim, "hidden_size": 512})
        else:
            kw["hidden_size"] = kw["num_attention_heads"] * head_dim
    return kw


def tiny_config(model_type: str, archs: set[str]) -> tuple[dict[str, Any] | None, str]:
    """``(config, "")`` for a probe, or ``(None, why it is skipped)``."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from kvplan.model import model_types

    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if model_types.role(model_type) != "decoder":
        return None, f"transformers role {model_types.role(model_type)}"
    if arch is None:
        return None, "no causal-LM class in transformers (multimodal: its text model type is probed instead)"
    if arch not in archs:
        return None, f"{arch} is not in vLLM 0.32's registry (native or Transformers backend)"
    cls = CONFIG_MAPPING[model_type]
    base = cls()
    if base.get_text_config(decoder=True) is not base:
        return None, "composite config (its text model type is probed instead)"
    try:
        config = cls(**tiny_kwargs(base)).to_dict()
    except Exception as exc:  # noqa: BLE001 - transformers' validation refuses the shrink
        return None, f"cannot shrink it ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    config = json.loads(json.dumps(config))  # as the cache stores it (tuples -> lists), so reruns compare equal
    config["architectures"] = [arch]
    config.pop("transformers_version", None)
    for key in DROP_KEYS.get(model_type, ()):
        config.pop(key, None)
    config.update(EXTRA_KEYS.get(model_type, {}))
    return config, ""


def generate(only: str | None, force: bool) -> None:
    """Write the tiny configs into the cache (entries whose config changes lose their probes). Run with
    vLLM's own Python (``/tmp/vllmcpu/bin/python``) for architectures whose configs vLLM's transformers
    version reads differently; ``--force`` lets this transformers replace such entries."""
    from gen_model_type_defaults import quiet_transformers

    quiet_transformers()
    import transformers
    from transformers import CONFIG_MAPPING

    archs = vllm_architectures()
    data = load()
    for model_type in sorted(CONFIG_MAPPING.keys()):
        if only and only not in model_type:
            continue
        config, why = tiny_config(model_type, archs)
        if config is None:
            if model_type in data["models"] and not force:
                continue
            data["models"].pop(model_type, None)
            if not why.startswith("transformers role") and not why.startswith("no causal-LM"):
                data["skipped"][model_type] = why
            continue
        data["skipped"].pop(model_type, None)
        entry = data["models"].setdefault(model_type, {"probes": {}})
        made_by = entry.get("transformers", transformers.__version__)
        if made_by != transformers.__version__ and not force:
            continue  # generated with vLLM's own transformers (its config conventions differ): keep it
        if entry.get("config") != config:
            entry.update({"config": config, "probes": {}, "transformers": transformers.__version__})
    save(data)
    print(f"{len(data['models'])} architectures to probe, {len(data['skipped'])} skipped", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# probe (vLLM)


def load() -> dict[str, Any]:
    if RESULTS.exists():
        return json.loads(RESULTS.read_text())
    return {"about": ("vLLM 0.32 CPU-backend probes of tiny configs (benchmarks/vllm_sweep.py); "
                      f"budget {BUDGET_GIB} GiB, max_model_len {MAX_LEN}, block size from vLLM"),
            "models": {}, "skipped": {}}


def save(data: dict[str, Any]) -> None:
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(RESULTS)


def probe_one(config: dict[str, Any], setting: dict[str, Any], budget_gib: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvplan-vllm-sweep-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config, indent=1))
        args = ["nice", str(TOOL), tmp, repr(budget_gib), "bfloat16", setting["kv_dtype"], str(MAX_LEN),
                json.dumps(setting["extra"])]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return {"error": "timed out after 600 s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"no JSON from the tool (rc {proc.returncode}): {proc.stderr[-400:]}"}
    out = json.loads(lines[-1])
    out.pop("startup_s", None)
    out.pop("peak_rss_mib", None)
    return out


def probe(only: str | None, retry_errors: bool) -> None:
    for name, setting in SETTINGS.items():  # every architecture at defaults first, then the other settings
        for model_type in sorted(load()["models"]):
            if only and only not in model_type:
                continue
            data = load()
            entry = data["models"][model_type]
            done = entry["probes"].get(name)
            if done is not None and not (retry_errors and "error" in done):
                continue
            if name != "default" and "error" in entry["probes"].get("default", {"error": "not probed"}):
                continue  # the architecture does not load: one error is enough
            started = time.time()
            budget = entry.get("budget_gib", BUDGET_GIB)
            result = probe_one(entry["config"], setting, budget)
            if name == "default" and "KV cache is needed" in result.get("error", "") and budget < BIGGER_BUDGET_GIB:
                budget = BIGGER_BUDGET_GIB  # one request at MAX_LEN does not fit: probe with more
                result = probe_one(entry["config"], setting, budget)
            print(f"{model_type} / {name}: {result.get('error', '')[-150:] or result.get('num_blocks')} "
                  f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
            data = load()  # reread: another step may have written meanwhile
            data["models"][model_type]["probes"][name] = result
            data["models"][model_type]["budget_gib"] = budget
            save(data)


# ---------------------------------------------------------------------------------------------
# compare (kvplan only)


def kvplan_numbers(config: dict[str, Any], setting: dict[str, Any], budget_gib: float) -> dict[str, Any]:
    from kvplan.options import Options
    from kvplan.planning.plan import plan_for_spec
    from kvplan.model.spec import spec_from_config
    from kvplan.units import GiB

    spec = spec_from_config(config, model_id="tiny", where="vllm_sweep_results.json")
    budget = int(budget_gib * GiB)
    options = Options(  # kvplan's own cpu-target defaults decide block size, batching and prefix caching
        model="tiny", gpu="cpu", kv_budget_bytes=budget, max_model_len=MAX_LEN, context=MAX_LEN, dtype="bfloat16",
        kv_dtype=None if setting["kv_dtype"] == "auto" else setting["kv_dtype"],
        max_num_batched_tokens=setting["extra"].get("max_num_batched_tokens"),
        prefix_caching=setting["extra"].get("enable_prefix_caching"),
    )
    plan = plan_for_spec(spec, options)
    a = plan.answer
    return {"num_blocks": a.num_blocks, "block_size": plan.layout.block_size, "kv_cache_tokens": a.kv_tokens,
            "max_concurrency": a.max_concurrency}


COLUMNS = ("num_blocks", "block_size", "kv_cache_tokens", "max_concurrency")


def compare(only: str | None) -> tuple[list[list[str]], dict[str, str], dict[str, int]]:
    from kvplan.errors import KvplanError

    data = load()
    rows, errors = [], {}
    counts = {"exact": 0, "different": 0}
    for model_type in sorted(data["models"]):
        if only and only not in model_type:
            continue
        entry = data["models"][model_type]
        default = entry["probes"].get("default", {})
        if "error" in default:
            errors[model_type] = default["error"]
            continue
        for name, setting in SETTINGS.items():
            vllm = entry["probes"].get(name)
            if vllm is None:
                continue
            if "error" in vllm:  # vLLM refuses this setting for the model: shown, not compared
                rows.append([model_type, name, "vLLM refuses: " + failure_reason(vllm["error"]), "", "", "", "n/a"])
                continue
            try:
                ours = kvplan_numbers(entry["config"], setting, entry.get("budget_gib", BUDGET_GIB))
            except KvplanError as exc:
                rows.append([model_type, name, "kvplan refuses: " + exc.one_line()[:120], "", "", "", "NO"])
                counts["different"] += 1
                continue
            cells, same = [], True
            for col in COLUMNS:
                theirs, mine = vllm[col], ours[col]
                equal = abs(theirs - mine) < 1e-9 if isinstance(theirs, float) else theirs == mine
                same &= equal
                fmt = (lambda v: f"{v:.4f}") if col == "max_concurrency" else (lambda v: f"{v:,}")  # noqa: E731
                cells.append(fmt(theirs) if equal else f"{fmt(theirs)} vs {fmt(mine)}")
            counts["exact" if same else "different"] += 1
            rows.append([model_type, name, *cells, "yes" if same else "NO"])
    return rows, errors, counts


_FAILURES = (  # (text in vLLM's error, why the architecture cannot be probed on vLLM's CPU build)
    ("Sparse Attention is not supported on CPU", "DeepSeek sparse attention has no CPU kernel"),
    ("sparse MLA backend", "sparse MLA attention has no CPU kernel"),
    ("mlp_layer_types", "DeepSeek-V4: its CPU kernels need AMX, and vLLM's config check rejects the tiny config"),
    ("does not recognize this architecture", "vLLM's transformers (5.19) does not know this model_type"),
    ("failed to be inspected", "vLLM cannot import its model module in the CPU build (torchvision removed)"),
    ("Tokenizer not available", "the model needs its tokenizer at start-up (the tool runs without one)"),
    ("triton", "the model needs Triton kernels (no Triton CPU backend)"),
    ("mamba-block-size can only be set", "vLLM sets a Mamba block size while its CPU MLA path turns prefix caching off"),
    ("has no attribute", "vLLM's model code reads a config field its transformers does not write"),
    ("FP8 KV cache requires head_size divisible by 32", "the CPU backend's fp8 KV cache needs head_size % 32 == 0"),
    ("unknown kwargs", "vLLM's config class rejects the config's keys"),
)


def failure_reason(error: str) -> str:
    for text, why in _FAILURES:
        if text in error:
            detail = error.strip().splitlines()[-1] if text == "has no attribute" else ""
            return why + (f" ({detail.strip()[:100]})" if detail else "")
    return error.strip().splitlines()[-1][:160]


RESULTS_MD = REPO / "benchmarks" / "vllm_oracle_results.md"
COVERAGE = REPO / "docs" / "coverage.md"
BEGIN, END = "<!-- vllm-sweep:begin -->", "<!-- vllm-sweep:end -->"


def markdown(rows: list[list[str]], errors: dict[str, str], counts: dict[str, int]) -> tuple[str, str]:
    """(the results table for benchmarks/vllm_oracle_results.md, the summary for docs/coverage.md)."""
    data = load()
    exact_archs = sorted({r[0] for r in rows if r[-1] == "yes"} - {r[0] for r in rows if r[-1] == "NO"})
    settings = {name: sum(1 for r in rows if r[1] == name and r[-1] != "n/a") for name in SETTINGS}
    refused = [r for r in rows if r[-1] == "n/a"]
    head = [BEGIN, "## Every decoder architecture vLLM's CPU build loads (`benchmarks/vllm_sweep.py`)", "",
            f"Tiny configs from transformers' defaults (the cache shape kept: KV heads at most 4, head_dim, windows, "
            f"layer patterns, state dims; few layers, small hidden size, MLP, vocabulary, experts), probed with "
            f"vLLM {next(iter(p.get('vllm') for e in data['models'].values() for p in e['probes'].values() if 'vllm' in p), '0.32.0')}'s CPU backend "
            f"at max_model_len {MAX_LEN:,} with an explicit KV budget ({BUDGET_GIB} GiB, {BIGGER_BUDGET_GIB} GiB where one "
            "request does not fit in that), at four settings; kvplan plans the same config with `--gpu cpu` and its "
            "own defaults. The probes and their configs are cached in `benchmarks/vllm_sweep_results.json`, so "
            "`python3 benchmarks/vllm_sweep.py compare --write` reruns the comparison without vLLM.", "",
            f"**{len(exact_archs)} architectures exact at every probed setting; {counts['exact']} of "
            f"{counts['exact'] + counts['different']} probes exact** (" +
            ", ".join(f"{name}: {n}" for name, n in settings.items()) + f"); vLLM refused {len(refused)} "
            "setting(s) for a model (shown, not compared)."]
    table = ["", "| model_type | setting | num_blocks | block_size | KV cache tokens | max concurrency | equal |",
             "|---|---|---|---|---|---|---|"] + ["| " + " | ".join(r) + " |" for r in rows]
    skipped = {**{t: why for t, why in data["skipped"].items()}, **{t: failure_reason(e) for t, e in errors.items()}}
    notes = ["", "### Not probed, and why", "", "| model_type | reason |", "|---|---|"]
    notes += [f"| `{t}` | {why.replace('|', '/')} |" for t, why in sorted(skipped.items())]
    full = "\n".join(head + table + notes + [END]) + "\n"
    summary = "\n".join(head + ["", "The table, and the architectures not probed with their reasons, are in "
                                  "[benchmarks/vllm_oracle_results.md](../benchmarks/vllm_oracle_results.md).", END]) + "\n"
    return full, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("generate", "probe", "compare"))
    parser.add_argument("--only", help="model types containing this text")
    parser.add_argument("--retry-errors", action="store_true", help="probe again where vLLM failed")
    parser.add_argument("--force", action="store_true", help="generate: replace entries another transformers made")
    parser.add_argument("--write", action="store_true", help="compare: rewrite the tables in the results and coverage docs")
    args = parser.parse_args(argv)
    if args.step == "generate":
        generate(args.only, args.force)
    elif args.step == "probe":
        probe(args.only, args.retry_errors)
    else:
        rows, errors, counts = compare(args.only)
        full, summary = markdown(rows, errors, counts)
        print(full)
        if args.write:
            replace_section(RESULTS_MD, full, BEGIN, END)
            replace_section(COVERAGE, summary, BEGIN, END)
        return 0 if counts["different"] == 0 else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
