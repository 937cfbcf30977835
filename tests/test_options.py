"""The option table (kvplan.options): one declaration per option, parsed and checked by its kind."""

from __future__ import annotations

import pytest

from kvplan.errors import InputError
from kvplan.options import BY_NAME, Options, options_from_values
from kvplan.units import GiB


def test_user_typed_values_are_parsed_by_kind():
    o = options_from_values({"model": "m", "context": "8k", "kv_budget": "12GiB", "gpus": "2", "tp": 2,
                             "prefix_tokens": "0", "activation_gib": 0, "gpu_util": "0.5"})
    # 8k = 8 x 1,024 tokens; 12 GiB = 12 x 2^30 bytes
    assert (o.context, o.kv_budget_bytes, o.gpu_count, o.tp) == (8192, 12 * GiB, 2, 2)
    assert (o.prefix_tokens, o.activation_bytes, o.gpu_util) == (0, 0, 0.5)
    assert options_from_values({"model": "m", "max_model_len": "auto"}).auto_max_model_len
    # Options field names take base units as they are
    assert options_from_values({"model": "m", "kv_budget_bytes": 1024, "gpu_count": 1}).kv_budget_bytes == 1024
    with pytest.raises(InputError, match="unknown option 'contxt'"):
        options_from_values({"model": "m", "contxt": "8k"})


@pytest.mark.parametrize(("field", "value", "message"), [
    ("kv_budget_bytes", -1, "invalid --kv-budget -1: must be positive"),
    ("overhead_bytes", -1, "invalid --overhead-gib -1: must not be negative"),
    ("gpu_count", 0, "invalid --gpus 0: must be a positive integer"),
    ("gpu_util", 1.5, r"invalid --gpu-util 1.5: must be in \(0, 1\]"),
    ("engine", "trt", "invalid --engine 'trt'"),
    ("usage_context", "cli", "invalid --usage-context 'cli'"),
])
def test_a_bad_value_names_its_flag(field, value, message):
    with pytest.raises(InputError, match=message):
        Options(model="m", **{field: value})


def test_the_gpu_defaults_to_h100_unless_its_memory_is_given():
    assert Options(model="m").gpu == "H100"
    assert Options(model="m", gpu_memory_bytes=24 * GiB).gpu is None  # a custom GPU, as on the CLI


def test_every_option_names_its_flag_and_its_field():
    assert BY_NAME["kv_budget"].flag == "--kv-budget" and BY_NAME["kv_budget"].field_name == "kv_budget_bytes"
    # --context has no CLI default of its own: a --max-model-len given alone is the context, else 8192
    assert BY_NAME["prefix_caching"].flag == "--prefix-caching" and BY_NAME["context"].cli_value is None
    assert BY_NAME["context"].default == 8192
