"""Traps a new user fell into, each fixed as a class (every spelling, every entry point):

- ``--gpu-memory 81920`` (nvidia-smi's MiB) planned an 80 TiB GPU and ``80TB`` a 73 TiB one; ``80GB`` silently
  planned 74.51 GiB where ``--gpu H100`` plans 79.20 GiB;
- a mistyped model id got a Hub/offline error without the bundled id it was close to;
- ``--max-model-len 2048`` alone was an error because ``--context`` kept its 8192 default;
- ``kvplan schema workload`` did not exist;
- ``--gpu-util 92`` got no "did you mean 0.92", and errors echoed ``92.0`` and ``'0GiB'`` for ``92`` and ``0``;
- comparing GPUs took a shell loop (``--gpu H100,H200,MI300X`` now prints a row each);
- a model no source knows could not be described by ``--layers/--kv-heads/--head-dim`` alone;
- polish: the GPU closest to ``H1OO`` began with ``cpu``; ``--gpus 3`` errors spoke of ``--tp 3``;
  ``sweep.gpus: [H100]`` got no "did you mean gpu"; the Python API's unknown option had no suggestion;
  ``dir(kvplan)`` listed ``Any`` and ``annotations``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import kvplan
from kvplan.errors import GpuNotFoundError, InputError, KvplanError, ModelNotFoundError
from kvplan.gpus import find_gpu, load_gpus
from kvplan.options import options_from_values
from kvplan.units import GB, GiB, MiB

sys.path.insert(0, str(Path(__file__).parents[1]))
from entry_point import assert_one_line, kvplan as run  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B"


# --gpu-memory --------------------------------------------------------------------------------------


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


# models ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("typo,meant", [("meta-llama/Lama-3.1-8B", LLAMA), ("Qwen/Qwen3-8b-", "Qwen/Qwen3-8B"),
                                        ("mistralai/Mistral-7B-v0.4", "mistralai/Mistral-7B-v0.3")])
def test_a_mistyped_model_id_offline_names_the_bundled_one(typo, meant):
    line = assert_one_line(run("estimate", typo, "--offline"))
    assert f"did you mean the bundled {meant}?" in line


def test_every_bundled_id_one_letter_off_is_named(monkeypatch):
    from kvplan.model.sources import bundled_ids, did_you_mean

    for model_id in bundled_ids():
        org, name = model_id.split("/")
        typo = f"{org}/{name[:3]}{name[4:]}"  # a letter dropped
        assert did_you_mean(typo) == model_id, (typo, did_you_mean(typo))


def test_a_model_described_by_options_alone_is_planned():
    p = kvplan.estimate("mymodel", layers=32, kv_heads=8, head_dim=128, weights_gib=15)
    # 2 x 32 layers x 8 kv_heads x 128 head_dim x 2 B (bfloat16) = 131,072 B/token; 15 GiB of weights
    assert p.kv_bytes_per_token_gpu == 131_072 and p.budget.weights.bytes == 15 * GiB
    assert p.source == "no config, described by --layers 32 --kv-heads 8 --head-dim 128"
    assert any("described by --layers 32" in n for n in p.notes)
    # the same through a check file (one resolver for every command)
    assert kvplan.check({"checks": [{"name": "m", "model": "mymodel", "layers": 32, "kv_heads": 8, "head_dim": 128,
                                     "weights_gib": 15, "require": {"concurrency": 8}}]}).passed
    with pytest.raises(ModelNotFoundError, match="not a local path") as err:
        kvplan.estimate("mymodel", layers=32, kv_heads=8)  # one of the three missing
    assert "describe it: --layers N --kv-heads N --head-dim N --weights-gib SIZE" in err.value.hint
    with pytest.raises(KvplanError, match="no weight facts"):
        kvplan.estimate("mymodel", layers=32, kv_heads=8, head_dim=128)


# --max-model-len is the context ------------------------------------------------------------------------


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


def test_the_workload_schema_exists():
    r = run("schema", "workload")
    assert r.returncode == 0 and json.loads(r.stdout)["title"] == "kvplan workload file"
    assert "capacity, whatif, workload" in assert_one_line(run("schema", "nope"))


# values echoed as typed ----------------------------------------------------------------------------------


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


# comparison rows -----------------------------------------------------------------------------------------


def test_a_list_of_gpus_prints_one_row_each_with_the_answers_figures():
    r = run("estimate", LLAMA, "--gpu", "H100,H200,MI300X", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["values"]["gpu"] for row in rows] == ["H100", "H200", "MI300X"]
    for row in rows:  # each row is the plan of that GPU alone
        alone = kvplan.estimate(LLAMA, gpu=row["values"]["gpu"]).to_dict()
        assert row["plan"]["answer"] == alone["answer"] and row["error"] is None
    table = run("estimate", LLAMA, "--gpu", "H100,H200,MI300X", "--tp", "1,3", "-b", "32").stdout
    assert all(len(line) <= 80 for line in table.splitlines()), table
    h100 = kvplan.estimate(LLAMA, gpu="H100", batch=32).answer
    assert f"{h100.kv_tokens:,}" in table and "error (1)" in table and "--tp 3 does not divide" in table


@pytest.mark.parametrize("flag,values", [("--tp", "1,2"), ("--kv-dtype", "auto,fp8"), ("--context", "8k,32k"),
                                         ("--gpu", "h100,a100-40gb")])
def test_every_listed_option_compares(flag, values):
    r = run("estimate", "Qwen/Qwen3-8B", flag, values, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["rows"]) == 2 and all(row["plan"] for row in doc["rows"])
    answers = {(row["plan"]["answer"]["kv_tokens"], row["plan"]["answer"]["max_requests"]) for row in doc["rows"]}
    assert len(answers) == 2  # each value changes the plan


def test_a_list_that_is_too_long_or_has_a_hole_is_one_line():
    assert "past the bound of 64" in assert_one_line(run("estimate", LLAMA, "--tp", "1,2,4,8,16",
                                                         "--context", "1k,2k,4k,8k", "--kv-dtype", "auto,fp8,int8,int4"))
    assert "an empty value in the list" in assert_one_line(run("estimate", LLAMA, "--gpu", "H100,,H200"))


# polish ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("typo,first", [("H1OO", "H100-SXM-80GB"), ("a1OO", "A100-SXM-80GB"), ("hl00", "H100-SXM-80GB"),
                                        ("mi3OOx", "MI300X-192GB"), ("rtx409", "RTX-4090-24GB")])
def test_the_closest_gpu_to_a_typo_comes_first(typo, first):
    with pytest.raises(GpuNotFoundError) as err:
        find_gpu(typo)
    assert err.value.hint.startswith(f"closest: {first}"), err.value.hint


def test_gpus_alone_errors_speak_of_gpus():
    line = assert_one_line(run("estimate", LLAMA, "--gpus", "3"))
    assert line.startswith("kvplan: error: --gpus 3 (tensor parallelism over all of them) does not divide")
    assert "--tp 3" not in line


def test_a_gpu_name_under_gpus_suggests_gpu(tmp_path):
    (tmp_path / "w.yaml").write_text(f"defaults: {{model: {LLAMA}}}\nsweep:\n  gpus: [H100]\n")
    r = run("report", str(tmp_path / "w.yaml"))
    assert r.returncode == 2 and "did you mean gpu?" in r.stderr


def test_the_python_api_suggests_an_option_and_lists_only_itself():
    with pytest.raises(InputError) as err:
        kvplan.estimate(LLAMA, gpux="H100")
    assert err.value.hint == "did you mean 'gpu'?"
    assert dir(kvplan) == sorted(kvplan.__all__) == ["__version__", "check", "estimate", "sweep"]


def test_the_memory_panel_separates_thousands_beside_numbers_that_do():
    # "87960.93 GB" stood beside "79.20 GiB"-style figures with separators
    from rich.console import Console

    from kvplan.render.estimate import render_plan

    console = Console(width=120, record=True, color_system=None)
    console.print(render_plan(kvplan.estimate(LLAMA, gpu_memory="1000")))
    text = console.export_text()
    assert "1,073.74 GB" in text and "1,000.00 GiB" in text
