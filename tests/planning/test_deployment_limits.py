"""What an acceptance tester found on main, one test per finding: a deployment the engine would refuse was
planned as starting, the scheduler's max_num_seqs was ignored, the launch command dropped options that change
the plan, and three outputs did not add up (the CPU panel, a hint the option rejects, a cut source column).

The rules live in one place (:class:`kvplan.planning.answer.Deployment` over the engine's ``refusal`` /
``request_limit`` / ``serve_command``); tests/planning/test_sections_agree.py checks the same properties over every
bundled spec.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvplan.errors import InputError
from kvplan.options import OPTIONS
from kvplan.planning.plan import estimate, options_from_values, plan_for_spec
from kvplan.model.sources import load_bundled
from kvplan.model.spec import build_spec

sys.path.insert(0, str(Path(__file__).parents[1]))
from entry_point import assert_one_line, kvplan  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B"


def _plan(model: str = LLAMA, **values: object):
    return estimate(options_from_values({"model": model, "offline": True, **values}))


def _json(*args: str) -> dict:
    r = kvplan("estimate", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _flat(text: str) -> str:
    """The rendered panels as one line of words (borders and wrapping removed)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


# 1. --max-model-len auto below the context ----------------------------------------------------


def test_a_context_past_max_model_len_auto_is_the_same_error_as_an_explicit_one():
    # before: exit 0, served --max-model-len 131072 while the answer said "1 x 204,800 tokens: fits", and
    # "contiguous (reserve max_model_len 131,072): 3 requests, -9 GiB wasted each"
    line = assert_one_line(kvplan("estimate", LLAMA, "--gpu", "H100", "-c", "200k", "--max-model-len", "auto"),
                           "--context 204800 exceeds --max-model-len auto = 131072")
    assert line.endswith("(lower --context to 131072)")
    longest = _plan(gpu="rtx4090", context="4k").answer.longest_startable_len  # ~41k tokens fit a 24 GB card
    assert 32_768 < longest < 65_536
    assert_one_line(kvplan("estimate", LLAMA, "--gpu", "rtx4090", "-c", "64k", "--max-model-len", "auto"),
                    f"--context 65536 exceeds --max-model-len auto = {longest}")
    explicit = assert_one_line(kvplan("estimate", LLAMA, "-c", "32k", "--max-model-len", "8k"),
                               "--context 32768 exceeds --max-model-len 8192")
    assert "raise --max-model-len to 32768" in explicit  # 8. a value the option accepts (it rejects "32,768")
    assert kvplan("estimate", LLAMA, "-c", "32k", "--max-model-len", "32768").returncode == 0
    # at a context that fits, auto plans what it serves: nothing reserved below the context
    p = _plan(gpu="rtx4090", context="32k", max_model_len="auto")
    assert p.max_model_len == longest and p.fragmentation.contiguous_waste_bytes >= 0


# 2. the model's maximum length ---------------------------------------------------------------


def test_a_max_model_len_past_the_models_maximum_does_not_start():
    # vLLM's _get_and_verify_max_len refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    d = _json(LLAMA, "--gpu", "H100", "-c", "200k")
    e, a = d["engine_report"], d["answer"]
    assert (e["starts"], e["longest_startable_len"], e["serve_command"]) == (False, 131_072, None)
    assert "exceeds the model's maximum length 131,072" in e["refusal"] and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in e["refusal"]
    assert (a["fits"], a["max_requests"], a["limited_by"], a["max_context_at_batch"]) == (False, 0, "refused", 131_072)
    assert a["fix"] == "--context 131072" and d["roofline"] is None
    text = _flat(kvplan("estimate", LLAMA, "--gpu", "H100", "-c", "200k").stdout)
    assert "vllm serve" not in text and "will report" not in text
    # not "it starts with --max-model-len 131072": with -c 200k the options reject that flag (the context is longer)
    assert "serve: none for max_model_len 204,800; the longest max_model_len it starts with is 131,072" in text


def test_suggestions_and_max_context_are_capped_at_the_models_maximum():
    # H200 at 1M tokens: before "max context at batch 1: 905,888", "it starts with --max-model-len 905888",
    # "try --context 131072 or --kv-dtype fp8 or --tp 2" (two of them still past 131,072) and "batch 0"
    p = _plan(gpu="H200", context="1m")
    a = p.answer
    assert not a.engine_starts and a.longest_startable_len == a.max_context_at_batch == 131_072
    assert a.fix == "--context 131072" and p.roofline is None
    # the cap does not depend on --context
    assert _plan(gpu="H200", context="8k").answer.max_context_at_batch == 131_072
    text = _flat(kvplan("estimate", LLAMA, "--gpu", "H200", "-c", "1m").stdout)
    assert "batch 0" not in text and "905,888" not in text and "905888" not in text


# 3. SGLang with no KV pool ----------------------------------------------------------------------


@pytest.mark.parametrize("model,context", [("meta-llama/Llama-3.1-70B", "8k"), ("ai21labs/AI21-Jamba-1.5-Mini", "32k"),
                                           ("Qwen/Qwen3-Next-80B-A3B-Instruct", "8k"),
                                           ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "32k")])
def test_sglang_refuses_to_start_without_a_pool(model, context):
    # SGLang's init_memory_pool: "Not enough memory. Please try to increase --mem-fraction-static"
    p = _plan(model, gpu="H100", engine="sglang", context=context)
    assert p.budget.kv_budget_bytes <= 0 and p.answer.num_blocks == 0
    assert not p.answer.engine_starts and "not enough memory" in p.answer.refusal
    assert p.answer.max_requests == 0 and not p.answer.fits and p.to_dict()["engine_report"]["serve_command"] is None


def test_sglang_reports_one_max_running_requests():
    # before: "max_running_requests=2,048" and "max_num_seqs stays sglang's 4,096" in one panel
    p = _plan(engine="sglang", context="128k")
    a = p.answer
    # max_running_requests = min(max(int(max_total_num_tokens / context_len x 512), 2048), 4096)
    assert a.max_num_seqs == min(max(int(a.kv_tokens / 131_072 * 512), 2048), 4096) == 2048
    text = _flat(kvplan("estimate", LLAMA, "--engine", "sglang", "-c", "128k").stdout)
    # SGLang prints its numbers without separators (max_running_requests=2048)
    assert "max_running_requests=2048," in text and "stays sglang's 2,048" in text and "4,096" not in text
    assert p.to_dict()["assumptions"]["max_num_seqs"] == 2048


# 4. max_num_seqs bounds the requests at once ------------------------------------------------------


def test_max_num_seqs_bounds_the_answer_fits_and_the_roofline():
    # before: "8 x 8,192 tokens: fits", 56 concurrent requests, roofline at batch 8 with --max-num-seqs 1
    p = _plan(max_num_seqs=1, batch=8)
    a = p.answer
    assert (a.max_requests, a.pool_requests, a.limited_by) == (1, 56, "max_num_seqs")
    assert not a.fits and a.max_context_at_batch == 0 and "--max-num-seqs 8" in a.fix and "--batch 1" in a.fix
    assert p.fragmentation.paged_max_requests == p.fragmentation.contiguous_max_requests == 1
    assert p.roofline.batch == 1
    assert _plan(max_num_seqs=8, batch=8).answer.fits  # the suggestion, re-planned


def test_a_capacity_check_counts_what_the_scheduler_runs(tmp_path):
    from kvplan.checks.capacity import run_checks
    from kvplan.checks.scenario import load_capacity

    path = tmp_path / "capacity.yaml"
    path.write_text(f"defaults: {{model: {LLAMA}, gpu: H100, context: 8192, max_num_seqs: 4}}\n"
                    "checks:\n  - name: seqs\n    require: {concurrency: 48}\n", encoding="utf-8")
    (result,) = run_checks(load_capacity(path), offline=True).results  # before: passed with actual 56
    outcome = result.outcomes[0]
    assert not result.passed and outcome.actual == 4
    assert any(s.startswith("more requests at once: max_num_seqs: 48") for s in outcome.suggestions)


# 5. the launch command carries every setting that changes the plan --------------------------------

HYBRID = "ai21labs/AI21-Jamba-1.5-Mini"
# option -> (value, the vLLM flag, the SGLang flag); a model other than Llama where the option needs one
LAUNCH: dict[str, tuple[object, str, str]] = {
    "tp": (2, "--tensor-parallel-size 2", "--tp 2"),
    "pp": (2, "--pipeline-parallel-size 2", "--pp-size 2"),
    "gpus": (2, "--tensor-parallel-size 2", "--tp 2"),
    "context": ("4k", "--max-model-len 4096", "--context-length 4096"),
    "max_model_len": ("16k", "--max-model-len 16384", "--context-length 16384"),
    "gpu_util": (0.8, "--gpu-memory-utilization 0.8", "--mem-fraction-static 0.8"),
    "dtype": ("float32", "--dtype float32", "--dtype float32"),
    "kv_dtype": ("fp8", "--kv-cache-dtype fp8_e4m3", "--kv-cache-dtype fp8_e4m3"),
    "quantization": ("fp8", "--quantization fp8", "--quantization fp8"),
    "ssm_dtype": ("float32", "--mamba-ssm-cache-dtype float32", "--mamba-ssm-dtype float32"),
    "kv_budget": ("20GiB", "--kv-cache-memory-bytes 21474836480", "--max-total-tokens"),
    "enforce_eager": (True, "--enforce-eager", "--disable-cuda-graph"),
    "block_size": (32, "--block-size 32", "--page-size 32"),
    "max_num_batched_tokens": (4096, "--max-num-batched-tokens 4096", "--chunked-prefill-size 4096"),
    "max_num_seqs": (64, "--max-num-seqs 64", "--max-running-requests 64"),
    "prefix_caching": (False, "--no-enable-prefix-caching", "--disable-radix-cache"),
    "chunked_prefill": (False, "--no-enable-chunked-prefill", ""),  # vLLM's switch (SGLang refuses it)
    "usage_context": ("llm", "--max-num-batched-tokens 16384 --max-num-seqs 1024", ""),
    "revision": ("abc123", "--revision abc123", "--revision abc123"),
    "enable_lora": (True, "--enable-lora", "--enable-lora"),
    "max_loras": (4, "--max-loras 4", "--max-loras-per-batch 4"),
    "max_lora_rank": (64, "--max-lora-rank 64", "--max-lora-rank 64"),
    "speculative": ("eagle", """--speculative-config '{"method": "eagle", "num_speculative_tokens": 1}'""",
                    "--speculative-algorithm EAGLE"),
    "expert_parallel": (True, "--enable-expert-parallel", "--ep-size"),
    # SGLang's hybrid sliding-window pool (vLLM refuses both): on a model that gets that pool
    "swa_full_tokens_ratio": (0.5, "", "--swa-full-tokens-ratio 0.5"),
    "disable_hybrid_swa_memory": (True, "", "--disable-hybrid-swa-memory"),
}
SWA = "openai/gpt-oss-120b"  # SGLang 0.5.8+ gives it the hybrid sliding-window pool
# options that are not engine settings, and why
NOT_LAUNCH = {
    "model": "named first", "gpu": "the hardware", "gpu_memory": "the hardware", "batch": "the workload",
    "prefix_tokens": "the workload", "images": "the workload (images per request)",
    "engine": "which command", "engine_version": "the installed release",
    "flashinfer": "the installation (whether FlashInfer is installed beside vLLM), not a flag",
    "weights_dtype": "the checkpoint's format", "weights_gib": "a fact about the checkpoint",
    "activation_gib": "kvplan's estimate of a term", "overhead_gib": "kvplan's estimate of a term",
    "cudagraph_gib": "kvplan's estimate of a term", "calibration": "measured terms for kvplan's estimate",
    "token": "how kvplan reads the Hub", "hub": "how kvplan reads the model", "offline": "how kvplan reads the model",
    "refresh": "how kvplan reads the model", "layers": "a what-if override of the config",
    "kv_heads": "a what-if override of the config", "head_dim": "a what-if override of the config",
    "num_speculative_tokens": "part of --speculative-config (with --speculative)",
}


def test_every_option_is_a_launch_setting_or_says_why_not():
    assert {o.name for o in OPTIONS} == set(LAUNCH) | set(NOT_LAUNCH)
    assert not set(LAUNCH) & set(NOT_LAUNCH)


@pytest.mark.parametrize("name,engine", [(n, e) for n in sorted(LAUNCH) for e, flag in zip(("vllm", "sglang"), LAUNCH[n][1:])
                                         if flag])  # SGLang has no usage context; vLLM no SWA pool
def test_every_plan_changing_option_is_in_the_launch_command(name, engine):
    value, vllm_flag, sglang_flag = LAUNCH[name]
    flag = vllm_flag if engine == "vllm" else sglang_flag
    model = HYBRID if name == "ssm_dtype" else SWA if name in ("swa_full_tokens_ratio", "disable_hybrid_swa_memory") else LLAMA
    base = {"gpu": "H200", "engine": engine, "revision": None}
    if name == "revision":
        spec = build_spec(load_bundled(model))
        p = plan_for_spec(spec, options_from_values({"model": model, **base, name: value}))
        default = plan_for_spec(spec, options_from_values({"model": model, **base}))
    else:
        p, default = _plan(model, **base, **{name: value}), _plan(model, **base)
    assert p.answer.engine_starts, p.answer.refusal
    command = p.rules.serve_command(p.launch)
    assert flag in command, (name, command)
    if name not in ("context", "max_model_len", "gpu_util"):
        assert flag not in default.rules.serve_command(default.launch)


# the vLLM flags of a serve line -> kvplan's options (values as the plan took them)
_BACK = {"--max-model-len": ("max_model_len", int), "--gpu-memory-utilization": ("gpu_util", float),
         "--tensor-parallel-size": ("tp", int), "--pipeline-parallel-size": ("pp", int), "--dtype": ("dtype", str),
         "--quantization": ("quantization", str), "--kv-cache-dtype": ("kv_dtype", str),
         "--mamba-ssm-cache-dtype": ("ssm_dtype", str), "--block-size": ("block_size", int),
         "--kv-cache-memory-bytes": ("kv_budget_bytes", int), "--max-num-batched-tokens": ("max_num_batched_tokens", int),
         "--max-num-seqs": ("max_num_seqs", int), "--revision": ("revision", str)}
_SWITCHES = {"--enforce-eager": ("enforce_eager", True), "--no-enable-prefix-caching": ("prefix_caching", False),
             "--enable-prefix-caching": ("prefix_caching", True),
             "--no-enable-chunked-prefill": ("chunked_prefill", False), "--enable-chunked-prefill": ("chunked_prefill", True)}


@pytest.mark.parametrize("values", [
    {"gpu": "H100", "tp": 2, "context": "16k", "dtype": "half", "kv_dtype": "fp8", "quantization": "fp8",
     "enforce_eager": True, "max_num_seqs": 128, "prefix_caching": False, "chunked_prefill": False},
    {"gpu": "A100-40GB", "max_model_len": "32k", "context": "8k", "block_size": 32, "max_num_batched_tokens": 4096,
     "gpu_util": 0.85, "usage_context": "llm"},
    {"gpu": "cpu", "kv_budget": "6GiB", "context": "4k"},
])
def test_a_pasted_serve_line_plans_the_same_deployment(values):
    """The command kvplan prints, read back flag by flag, gives the same plan (what `vllm serve` would start)."""
    p = _plan(**values)
    words = shlex.split(p.rules.serve_command(p.launch))
    assert words[:3] == ["vllm", "serve", LLAMA]
    back: dict[str, object] = {"model": LLAMA, "gpu": values["gpu"], "context": p.options.context}
    i = 3
    while i < len(words):
        if words[i] in _SWITCHES:
            key, switch = _SWITCHES[words[i]]
            back[key] = switch
            i += 1
            continue
        key, kind = _BACK[words[i]]
        back[key] = kind(words[i + 1])
        i += 2
    again = plan_for_spec(p.spec, replace(options_from_values({"model": LLAMA, "gpu": values["gpu"]}), **{
        k: v for k, v in back.items() if k not in ("model", "gpu")}))
    # the same deployment: budget, pool, requests at once, verdict; the serve line fixes max_model_len, so its
    # longest context is at most that (kvplan's own, following --context, reaches the model's maximum)
    assert again.budget == p.budget and again.max_model_len == p.max_model_len
    assert replace(again.answer, max_context_at_batch=0) == replace(p.answer, max_context_at_batch=0)
    assert again.answer.max_context_at_batch == p.deployment.max_context(p.options.batch, p.max_model_len)


# 6. a model the release does not serve ----------------------------------------------------------


def test_no_report_and_no_command_for_a_model_the_release_dropped(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))
    from test_cross_attention import LLAMA_32_90B_VISION

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_32_90B_VISION))
    args = (str(tmp_path), "--gpu", "H200", "--tp", "4", "--weights-gib", "177")
    d = _json(*args)
    assert d["engine_report"]["starts"] is False and d["engine_report"]["serve_command"] is None
    assert "do not serve MllamaForConditionalGeneration" in d["engine_report"]["refusal"]
    assert d["answer"]["max_requests"] == 0 and d["engine_report"]["longest_startable_len"] == 0
    text = _flat(kvplan("estimate", *args).stdout)
    assert "will report" not in text and "vllm serve" not in text and "will refuse to start" in text
    for other in (("--engine-version", "0.10.2"), ("--engine", "sglang")):  # releases that serve it
        assert _json(*args, *other)["engine_report"]["starts"] is True


# 7. the CPU backend's memory adds up --------------------------------------------------------------


def test_the_cpu_panel_adds_the_kv_space_to_the_weights():
    # before: total 0.25 GiB, - weights 15.26 GiB, = KV budget 0.25 GiB
    text = _flat(kvplan("estimate", "Qwen/Qwen3-8B", "--gpu", "cpu", "--kv-budget", "0.25GiB", "-c", "1k").stdout)
    assert "KV cache space 0.25 GiB" in text and "+ weights 15.26 GiB" in text
    assert "= host memory in use 15.51 GiB" in text and "= KV budget" not in text and "− weights" not in text
    p = _plan("Qwen/Qwen3-8B", gpu="cpu", kv_budget="0.25GiB", context="1k")
    assert "--gpu-memory-utilization" not in p.rules.serve_command(p.launch)
    assert "--kv-cache-memory-bytes 268435456" in p.rules.serve_command(p.launch)


# 8. hints print values the options accept ---------------------------------------------------------


def test_no_hint_suggests_a_flag_value_with_separators():
    """A suggestion such as ``raise --max-model-len to {n:,}`` prints 32,768, which --max-model-len rejects."""
    suggestion = re.compile(r"(?:to|try|use|with|pass|raise|lower)\s+--[a-z][a-z-]*\s+(?:to\s+)?\{[^}]*:,")
    offenders = []
    for path in sorted((Path(__file__).parents[2] / "kvplan").rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if suggestion.search(line):
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []
    with pytest.raises(InputError) as err:
        options_from_values({"model": LLAMA, "context": "32k", "max_model_len": "8k"})
    value = err.value.hint.split("--max-model-len to ")[1].split()[0]
    assert options_from_values({"model": LLAMA, "context": "32k", "max_model_len": value}).max_model_len == 32_768


# 9. limits the engine rejects, and what the user typed ----------------------------------------------


def test_batched_tokens_below_max_num_seqs_is_an_error_naming_both():
    # vLLM's SchedulerConfig: max_num_batched_tokens >= max_num_seqs
    assert_one_line(kvplan("estimate", LLAMA, "--max-num-batched-tokens", "1"),
                    "max_num_batched_tokens 1 is below max_num_seqs 1024", "raise --max-num-batched-tokens to 1024")
    # and V0 without chunked prefill: max_num_batched_tokens >= max_model_len
    with pytest.raises(InputError, match="max_num_batched_tokens 4096 is below max_model_len 16384"):
        _plan(engine_version="0.6.3", context="16k", max_num_batched_tokens=4096)
    assert _plan(max_num_batched_tokens=1024).answer.fits


def test_an_out_of_range_size_echoes_what_was_typed():
    # before: "invalid --gpu-memory 9.766e+26 TiB"
    assert_one_line(kvplan("estimate", LLAMA, "--gpu-memory", "1e30"), "invalid --gpu-memory 1e30: must be at most")


# 10. the memory panel never cuts a source ----------------------------------------------------------


@pytest.mark.parametrize("columns", ["80", "200"])
def test_the_memory_panel_wraps_its_sources(columns):
    # before: "checkpoint: same tensors as meta-ll…", "forward 8,192 tokens …" at any width
    r = kvplan("estimate", LLAMA, "--gpu", "H100", env={"COLUMNS": columns})
    assert r.returncode == 0 and "…" not in r.stdout
    text = _flat(r.stdout)
    p = _plan(gpu="H100")
    for term in p.budget.terms:
        assert " ".join(term.source.split()) in text, term.source


def test_simulate_runs_the_engines_limits():
    """simulate's scheduler seats what the answer says (SGLang's derived max_running_requests, not its 4,096
    ceiling), and a deployment the engine refuses is not simulated."""
    from kvplan.sim.simulate import config_from_plan

    p = _plan(engine="sglang", context="128k")
    sim, _ = config_from_plan(p)
    assert sim.pool.max_num_seqs == p.answer.max_num_seqs == 2048
    with pytest.raises(InputError, match="refuses to start this deployment: max_model_len 204,800 exceeds"):
        config_from_plan(_plan(context="200k"))
