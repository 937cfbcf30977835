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


@pytest.mark.parametrize("gpus", [2, 4, 8])
@pytest.mark.parametrize("given", ["tp", "pp"])
def test_gpus_with_one_of_tp_pp_honours_it_and_splits_the_rest(gpus, given):
    # `--gpus 2 --tp 1` was planned as tp 2 (a note said no --tp was given): a given tp or pp is never replaced;
    # the other takes the rest, and the plan says so
    from kvplan.planning.plan import estimate

    other = "pp" if given == "tp" else "tp"
    for n in (d for d in (1, 2, 4, 8) if d <= gpus and gpus % d == 0):
        o = options_from_values({"model": "meta-llama/Llama-3.1-8B", "gpus": gpus, given: n})
        assert (getattr(o, given), getattr(o, other), o.gpu_count) == (n, gpus // n, gpus), (given, n)
        notes = [x for x in estimate(o).notes if x.startswith(f"--gpus {gpus}")]
        if gpus // n > 1:  # the rest is split: one note names the given flag and the size the rest took
            kind = "pipeline" if other == "pp" else "tensor"
            assert notes == [f"--gpus {gpus} with --{given} {n}: {kind} parallelism over the rest ({other} {gpus // n})"]
        else:
            assert notes == []


@pytest.mark.parametrize(("values", "message"), [
    ({"gpus": 3, "tp": 2}, "--gpus 3 is not a multiple of --tp 2"),
    ({"gpus": 6, "pp": 4}, "--gpus 6 is not a multiple of --pp 4"),
    ({"gpus": 2, "tp": 1, "pp": 1}, "--tp 1 x --pp 1 = 1 does not match --gpus 2"),
    ({"gpus": 8, "tp": 2, "pp": 2}, "--tp 2 x --pp 2 = 4 does not match --gpus 8"),
])
def test_gpus_that_tp_and_pp_cannot_make_are_refused(values, message):
    with pytest.raises(InputError, match=message):
        options_from_values({"model": "m", **values})


def test_gpus_and_tp_on_the_command_line_are_honoured():
    # the CLI passes --tp/--pp only when given (their default is not sent), so `--tp 1` is a user's tp 1
    import json

    from typer.testing import CliRunner

    from kvplan.cli.app import app

    r = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-3.1-8B", "--gpus", "2", "--tp", "1", "--json"])
    assert r.exit_code == 0, r.output
    a = json.loads(r.stdout)["assumptions"]
    assert (a["gpu_count"], a["tp"], a["pp"]) == (2, 1, 2)
