"""The option table (kvplan.options): one declaration per option, parsed and checked by its kind."""

from __future__ import annotations

import json

import pytest

import kvplan
from kvplan.errors import InputError
from kvplan.gpus import load_gpus
from kvplan.options import BY_NAME, Options, options_from_values
from kvplan.units import GB, GiB, MiB

from entry_point import assert_one_line, kvplan as run

LLAMA = "meta-llama/Llama-3.1-8B"


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


@pytest.mark.parametrize("typed", ["81920", "81559", "2048", "1025", 81920, 1536.5])
def test_a_bare_gpu_memory_past_1024_is_taken_for_mib_and_refused(typed):
    with pytest.raises(InputError) as err:
        options_from_values({"model": "x", "gpu_memory": typed})
    assert "a number without a unit is GiB" in err.value.message and f"{typed}MiB" in (err.value.hint or "")


@pytest.mark.parametrize("typed,expected", [("80", 80 * GiB), ("1024", 1024 * GiB), ("81920MiB", 81920 * MiB),
                                            ("80GB", 80 * GB), ("0.5", GiB // 2)])
def test_a_gpu_memory_with_a_unit_or_a_plausible_bare_number_is_taken(typed, expected):
    assert options_from_values({"model": "x", "gpu_memory": typed}).gpu_memory_bytes == expected


@pytest.mark.parametrize("typed", ["80TB", "17TiB", "20000GiB"])
def test_a_device_larger_than_16_tib_is_a_unit_mix_up(typed):
    line = assert_one_line(run("estimate", LLAMA, "--gpu-memory", typed))
    assert f"invalid --gpu-memory {typed}: must be at most 16 TiB" in line


def test_a_gpu_memory_says_what_it_means_and_the_catalogue_gpu_beside_it():
    p = kvplan.estimate(LLAMA, gpu_memory="80GB")
    note = next(n for n in p.notes if n.startswith("--gpu-memory"))
    assert "74.51 GiB (80,000,000,000 B)" in note and "GB is 10^9 B" in note
    assert "H100-SXM-80GB reports 79.20 GiB, not its box's 80 GB (--gpu h100 plans that)" in note
    # every catalogue GPU's box size, in GB and in GiB, names a GPU with that box and what it reports
    for gpu in load_gpus():
        if gpu.is_cpu or not gpu.marketing_gb or not gpu.memory_bytes:
            continue
        for size in (f"{gpu.marketing_gb:g}GB", f"{gpu.marketing_gb:g}GiB"):
            note = next(n for n in kvplan.estimate(LLAMA, gpu_memory=size).notes if n.startswith("--gpu-memory"))
            assert f"not its box's {gpu.marketing_gb:g} GB" in note, (gpu.name, size, note)


def test_a_max_model_len_given_alone_is_the_context_everywhere(tmp_path):
    assert options_from_values({"model": "x", "max_model_len": "2048"}).context == 2048
    assert options_from_values({"model": "x", "max_model_len": "2k", "context": "1k"}).context == 1024
    assert options_from_values({"model": "x"}).context == 8192
    assert kvplan.estimate(LLAMA, max_model_len=2048).answer.context == 2048
    r = run("estimate", LLAMA, "--max-model-len", "2048", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["assumptions"]["context_tokens"] == 2048
    assert kvplan.check({"checks": [{"name": "c", "model": LLAMA, "max_model_len": 2048,
                                     "require": {"concurrency": 1}}]}).results[0].plan.options.context == 2048
    rows = kvplan.sweep({"defaults": {"model": LLAMA}, "sweep": {"max_model_len": [2048, 4096]}}).rows
    assert [(r.context, r.max_model_len) for r in rows] == [(2048, 2048), (4096, 4096)]


@pytest.mark.parametrize("flag,typed,echo", [("--gpu-util", "92", "92"), ("--gpu-util", "0", "0"),
                                             ("--kv-budget", "0", "'0'"), ("--gpu-memory", "0", "'0'"),
                                             ("--weights-gib", "0", "'0'"), ("--gpu-util", "1.5", "1.5")])
def test_an_error_echoes_the_value_as_typed(flag, typed, echo):
    line = assert_one_line(run("estimate", LLAMA, flag, typed))
    assert f"invalid {flag} {echo}:" in line and "GiB'" not in line and ".0:" not in line


@pytest.mark.parametrize("typed,meant", [("92", "0.92"), ("90", "0.9"), ("100", "1")])
def test_a_percentage_for_gpu_util_suggests_the_fraction(typed, meant):
    line = assert_one_line(run("estimate", LLAMA, "--gpu-util", typed))
    assert f"did you mean --gpu-util {meant}?" in line
    assert "did you mean" not in assert_one_line(run("estimate", LLAMA, "--gpu-util", "250"))


def test_a_list_that_is_too_long_or_has_a_hole_is_one_line():
    assert "past the bound of 64" in assert_one_line(run("estimate", LLAMA, "--tp", "1,2,4,8,16",
                                                         "--context", "1k,2k,4k,8k", "--kv-dtype", "auto,fp8,int8,int4"))
    assert "an empty value in the list" in assert_one_line(run("estimate", LLAMA, "--gpu", "H100,,H200"))


def test_gpus_alone_errors_speak_of_gpus():
    line = assert_one_line(run("estimate", LLAMA, "--gpus", "3"))
    assert line.startswith("kvplan: error: --gpus 3 (tensor parallelism over all of them) does not divide")
    assert "--tp 3" not in line


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


def test_a_value_checked_once_is_still_refused_in_another_type_or_field():
    """Options remembers values that passed their check (planning re-makes Options by the thousand): a
    remembered value never lets a wrong one through, not under another field, not as another type."""
    from dataclasses import replace

    ok = Options(model="m", batch=4, gpu_util=1.0)
    assert replace(ok, batch=8).batch == 8
    with pytest.raises(InputError, match="--batch"):
        replace(ok, batch=0)
    with pytest.raises(InputError, match="--gpu-util"):
        replace(ok, gpu_util=4.0)  # 4 passed as a batch, never as a fraction
    with pytest.raises(InputError, match="--batch"):
        replace(ok, batch=True)  # True == 1 but not a count
    with pytest.raises(InputError, match="--batch"):
        replace(ok, batch=1.5)
