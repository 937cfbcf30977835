"""The launch line serves the deployment that was planned.

``--weights-dtype int4`` planned 36.8 GiB of weights for Llama-3.1-70B while its ``vllm serve`` line loads the
131 GiB bf16 checkpoint, with no note; ``--quantization awq`` on a bf16 checkpoint was accepted, which vLLM
refuses. The rule is :func:`kvplan.planning.weights.served_weights` (and :func:`~kvplan.planning.weights.check_quantization`
for ``--quantization``): over every bundled spec and weights dtype, either the command loads the weights planned,
or it passes the online ``--quantization fp8`` that makes them, or a note says what it loads instead and which
checkpoint to serve.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from kvplan.engines import CHECKPOINT_QUANTIZATION, ONLINE_QUANTIZATION
from kvplan.errors import InputError
from kvplan.model.sources import bundled_ids, load_bundled
from kvplan.model.spec import build_spec
from kvplan.planning.plan import Options, plan_for_spec
from kvplan.planning.weights import served_weights, weights_bytes as _weights
from kvplan.units import GiB, parse_dtype

sys.path.insert(0, str(Path(__file__).parents[1]))
from entry_point import assert_one_line, kvplan  # noqa: E402


@lru_cache(maxsize=None)
def spec_of(model_id: str):  # noqa: ANN201
    return build_spec(load_bundled(model_id))


def _stored_bytes(p) -> int:  # noqa: ANN001
    """What the checkpoint holds, as the engine loads it (no --weights-dtype)."""
    return _weights(p.spec, replace(p.options, weights_dtype=None), None, parse_dtype(p.model_dtype))[0]


def test_the_quoted_int4_plan_says_what_the_command_loads():
    r = kvplan("estimate", "meta-llama/Llama-3.1-70B-Instruct", "--weights-dtype", "int4", "--gpu", "H200")
    text = " ".join(r.stdout.replace("│", " ").split())
    assert "vllm serve meta-llama/Llama-3.1-70B-Instruct" in text
    assert ("not what was planned: the plan's weights are int4 (36.79 GiB in all) but "
            "meta-llama/Llama-3.1-70B-Instruct is a bfloat16 checkpoint (131.42 GiB)") in text
    assert "serve an AWQ or GPTQ 4-bit checkpoint of the model in its place" in text


@pytest.mark.parametrize("model_id", bundled_ids())
def test_every_launch_loads_what_was_planned_or_says_so(model_id):
    spec = spec_of(model_id)
    for weights_dtype in (None, "fp8", "int8", "int4"):
        p = plan_for_spec(spec, Options(model=model_id, gpu="H200", weights_dtype=weights_dtype))
        quantization, note = served_weights(p)
        command = p.rules.serve_command(p.launch)
        where = (model_id, weights_dtype, command, note)
        if weights_dtype is None or parse_dtype(weights_dtype, weights=True).name == spec.weights_format:
            # nothing asked, or the format the checkpoint stores (fp8 for DeepSeek-R1): the checkpoint as it is
            assert p.weights_dtype == (spec.weights_format or p.model_dtype), where
            assert (quantization, note) == (None, None) and "--quantization" not in command, where
            assert p.weights_total_bytes == _stored_bytes(p), where
        elif quantization is not None:  # the engine quantizes the 16-bit checkpoint as planned
            assert quantization == "fp8" and weights_dtype == "fp8" and not spec.quant_method, where
            assert f"--quantization {quantization}" in command and note is None, where
            assert ONLINE_QUANTIZATION[quantization] == "fp8", where
        else:  # the command loads the checkpoint as stored: the note says so, with both sizes
            assert note and "--quantization" not in command, where
            assert f"the plan's weights are {p.weights_dtype} ({p.weights_total_bytes / GiB:,.2f} GiB" in note, where
            assert f"checkpoint ({_stored_bytes(p) / GiB:,.2f} GiB)" in note and "in its place" in note, where
            assert p.to_dict()["engine_report"]["serve_note"] == (None if p.answer.refusal else note), where


@pytest.mark.parametrize("model_id", bundled_ids())
def test_quantization_takes_only_what_the_checkpoint_holds(model_id):
    spec = spec_of(model_id)
    for method in ("awq", "gptq", "mxfp4", "compressed-tensors", "fp8", "bitsandbytes"):
        options = Options(model=model_id, gpu="H200", quantization=method)
        is_format = method in CHECKPOINT_QUANTIZATION
        held = spec.quant_method
        refused = (bool(held) and held != method and not (held == "fp8" and method == "fp8")) or \
            (not held and is_format)
        if refused:
            with pytest.raises(InputError, match=r"--quantization"):
                plan_for_spec(spec, options)
        else:
            p = plan_for_spec(spec, options)
            assert f"--quantization {method}" in p.rules.serve_command(p.launch), (model_id, method)


def test_a_checkpoint_format_on_a_16_bit_checkpoint_is_one_line():
    line = assert_one_line(kvplan("estimate", "meta-llama/Llama-3.1-70B-Instruct", "--quantization", "awq"))
    assert "is a bfloat16 checkpoint with no quantization_config" in line and "--weights-dtype int4" in line
    line = assert_one_line(kvplan("estimate", "openai/gpt-oss-20b", "--quantization", "gptq"))
    assert "does not match openai/gpt-oss-20b's quantization_config (quant_method mxfp4)" in line
