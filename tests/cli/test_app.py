"""The CLI through typer's runner: exit codes, --json schema, one-line errors."""

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from kvplan.cli.app import app

from entry_point import assert_one_line, kvplan as run_entry_point

runner = CliRunner()


def run(*args, **kw):
    return runner.invoke(app, list(args), **kw)


def test_estimate_prints_the_answer():
    r = run("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100")
    assert r.exit_code == 0, r.output
    assert "131,072 B/token" in r.output
    assert "KV budget" in r.output and "GiB" in r.output
    assert "will report: GPU KV cache size" in r.output
    assert "vllm serve meta-llama/Llama-3.1-8B" in r.output


def test_estimate_json_schema():
    r = run("estimate", "meta-llama/Llama-3.1-8B", "-g", "h100", "--context", "8k", "--batch", "4", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1
    assert set(doc) >= {"model", "assumptions", "per_token", "budget", "pool", "answer", "engine_report",
                        "fragmentation", "prefix", "roofline", "notes"}
    assert doc["per_token"]["kv_bytes_per_token_gpu"] == 131_072
    assert doc["assumptions"]["context_tokens"] == 8192 and doc["assumptions"]["batch"] == 4
    assert doc["assumptions"]["kv_dtype"] == "bfloat16" and doc["assumptions"]["block_size"] == 16
    b = doc["budget"]
    assert b["kv_budget_bytes"] == b["usable_bytes"] - b["weights_bytes"] - b["activation_bytes"] - b["overhead_bytes"] - b["cudagraph_bytes"]
    assert doc["pool"]["num_blocks"] == b["kv_budget_bytes"] // (16 * 131_072)
    assert doc["answer"]["fits"] is True
    assert doc["model"]["source"].startswith("bundled spec")


def test_units_in_flags():
    r = run("estimate", "meta-llama/Llama-3.1-8B", "--gpu-memory", "80GB", "--kv-budget", "1GiB", "--context", "4k", "--json")
    doc = json.loads(r.stdout)
    assert doc["assumptions"]["gpu_memory_bytes"] == 80 * 10**9
    assert doc["budget"]["kv_budget_bytes"] == 2**30
    assert doc["answer"]["blocks_per_request"] == 256


def test_prefix_flag_reports_savings():
    r = run("estimate", "meta-llama/Llama-3.1-8B", "--context", "4096", "--prefix-tokens", "2000", "--json")
    assert json.loads(r.stdout)["prefix"]["shared_blocks"] == 125


@pytest.mark.parametrize("args,needle", [
    (["estimate", "no-such-model"], "kvplan models"),
    (["estimate", "Llama-3.1-8C"], "closest bundled: meta-llama/Llama-3.1-8B"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H1000"], "unknown GPU"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--context", "-5"], "--context"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--context", "eight"], "--context"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--batch", "0"], "--batch"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--tp", "3"], "--tp 3"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--tp", "2", "--pp", "1", "--gpus", "4"], "--gpus"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--tp", "2", "--gpus", "3"], "--gpus 3 is not a multiple of --tp 2"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--gpu-util", "0"], "--gpu-util"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--kv-dtype", "fp7"], "kv-dtype"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--gpu-memory", "lots"], "gpu-memory"),
    (["estimate", "meta-llama/Llama-3.1-8B", "--engine-version", "0.0.1"], "engine-version"),
])
def test_errors_are_one_line_and_exit_2(args, needle):
    r = run(*args)
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith("kvplan: error:") and "\n" not in err and needle in err
    assert "Traceback" not in r.output


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("KVPLAN_DEBUG", "1")
    r = run("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H1000")
    assert r.exit_code != 0 and r.exception is not None


def test_local_config_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "float16"}))
    r = run("estimate", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["model"]["source"].startswith("local config")
    assert doc["per_token"]["kv_bytes_per_token_gpu"] == 2 * 2 * 2 * 64 * 2  # 2 x layers x kv heads x 256/4 x 2 B


def test_models_and_gpus_list():
    r = run("models", "--json")
    ids = [m["id"] for m in json.loads(r.stdout)]
    assert "meta-llama/Llama-3.1-8B" in ids and len(ids) >= 15
    r = run("gpus", "--json")
    assert any(g["name"].startswith("H100") for g in json.loads(r.stdout))
    assert run("gpus").exit_code == 0 and run("models").exit_code == 0


def test_models_show_breaks_down_groups():
    r = run("models", "show", "openai/gpt-oss-20b", "--json")
    assert r.exit_code == 0, r.output
    kinds = {g["kind"]: g for g in json.loads(r.stdout)["groups"]}
    assert kinds["sliding"]["window_tokens"] == 128 and kinds["full"]["layers"] == 12


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim", "torch_dtype",
        "sliding_window", "layer_types", "kv_lora_rank", "qk_rope_head_dim", "text_config", "multi_query",
        "intermediate_size", "vocab_size", "use_sliding_window", "sliding_window_pattern", "max_position_embeddings"]
GOOD = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "hidden_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(broken=st.dictionaries(st.sampled_from(KEYS), JSONISH, min_size=1, max_size=4), drop=st.sets(st.sampled_from(sorted(GOOD))))
def test_malformed_configs_give_one_line_errors(tmp_path_factory, broken, drop):
    """Missing keys, wrong types, null, negative, zero, huge, NaN, nested garbage: exit 0 or 2, never a traceback."""
    config = {k: v for k, v in GOOD.items() if k not in drop}
    config.update(broken)
    folder = tmp_path_factory.mktemp("cfg")
    try:
        text = json.dumps(config)
    except ValueError:
        return
    (folder / "config.json").write_text(text)
    r = run("estimate", str(folder), "--weights-gib", "1", "--json")
    assert r.exit_code in (0, 2), r.output
    if r.exit_code == 2:
        err = r.stderr.strip()
        assert err.startswith("kvplan: error:") and "\n" not in err, err
        assert r.exception is None or isinstance(r.exception, SystemExit)
    else:
        json.loads(r.stdout)


def _command_paths():
    """Every command and subcommand, as the words typed after ``kvplan``."""
    import typer.main

    def walk(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


@pytest.mark.parametrize("path, command", _command_paths(), ids=lambda p: " ".join(p) if isinstance(p, list) else "")
def test_help_at_80_columns_shows_every_option_name_whole(path, command):
    """rich's options table cut option names to fit (``--tp,--tensor-paral…``, ``--gpu-util,--gpu-memory-util…``):
    at 80 columns every flag of every visible option is printed whole, and nothing is cut."""
    import re

    r = run(*path, "--help", env={"COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        for flag in [*param.opts, *param.secondary_opts]:
            if flag.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", r.stdout), (path, flag)


@pytest.mark.parametrize("args, field, value", [
    (["--tensor-parallel-size", "2"], "tp", 2),
    (["--pipeline-parallel-size", "2", "--tp", "1"], "pp", 2),
    (["--gpu-memory-utilization", "0.5"], "gpu_util", 0.5),
    (["--kv-cache-dtype", "fp8"], "kv_dtype", "fp8_e4m3"),
    (["--no-prefix-caching"], "prefix_caching", False),
    (["--prefix-caching"], "prefix_caching", True),
    (["--tp", "2", "--tensor-parallel-size", "2"], "tp", 2),
])
def test_every_spelling_of_an_option_is_its_own_row_and_means_the_same(args, field, value):
    r = run("estimate", "meta-llama/Llama-3.1-8B", *args, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["assumptions"][field] == value


@pytest.mark.parametrize("args, message", [
    (["--tp", "2", "--tensor-parallel-size", "4"], "--tp 2 and --tensor-parallel-size 4 disagree (give one of them)"),
    (["--prefix-caching", "--no-prefix-caching"], "--prefix-caching and --no-prefix-caching disagree"),
])
def test_two_spellings_given_different_values_is_an_error(args, message):
    r = run("estimate", "meta-llama/Llama-3.1-8B", *args)
    assert r.exit_code == 2 and message in r.output


def test_models_show_takes_vllms_kv_cache_dtype():
    r = run("models", "show", "meta-llama/Llama-3.1-8B", "--kv-cache-dtype", "fp8", "--json")
    fp8 = run("models", "show", "meta-llama/Llama-3.1-8B", "--kv-dtype", "fp8", "--json")
    assert r.exit_code == 0 and r.stdout == fp8.stdout


def test_the_workload_schema_exists():
    r = run_entry_point("schema", "workload")
    assert r.returncode == 0 and json.loads(r.stdout)["title"] == "kvplan workload file"
    assert "capacity, whatif, workload" in assert_one_line(run_entry_point("schema", "nope"))


# ---------------------------------------------------------------------------------------------
# the plain estimate path (kvplan.cli.entry: no typer) reads a line exactly as typer does


def _typer_estimate_params():
    import typer

    from kvplan.cli.app import build_app

    return typer.main.get_command(build_app("estimate")).commands["estimate"].params


def test_the_plain_spellings_are_the_typer_commands_own():
    from kvplan.cli.flags import ESTIMATE_SPELLINGS

    types = {"int": int, "str": str, "boolean": bool}
    seen = {}
    for p in _typer_estimate_params():
        if p.param_type_name == "argument":
            assert p.name == "model" and p.nargs == 1
            continue
        # a form the plain reader does not know (a second spelling, an env variable, a list) would fail here
        assert not p.secondary_opts and p.envvar is None and not p.multiple and p.nargs == 1, p.name
        assert p.callback is None and not p.is_eager and p.expose_value
        assert (p.is_flag, types[p.type.name]) in ((True, bool), (False, int), (False, str)), p.name
        seen.update({flag: (p.name, types[p.type.name], p.default) for flag in p.opts})
    assert {flag: tuple(s) for flag, s in ESTIMATE_SPELLINGS.items()} == seen


def _calls(monkeypatch, main, argv):
    """(the estimate command's calls, the exit code, stderr) when ``main`` reads ``argv``."""
    import contextlib
    import io

    from kvplan.cli import estimate

    calls = []

    def record(model, json_out=False, brief=False, *, values, token):
        calls.append({"model": model, "json_out": json_out, "brief": brief, "values": values, "token": token})

    monkeypatch.setattr(estimate, "estimate_command", record)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return calls, code, err.getvalue()


_PLAIN = [("--gpu", "H100"), ("-g", "a100"), ("--gpu", "H100,H200"), ("--tp", "2"), ("--tensor-parallel-size", "2"),
          ("--tensor-parallel-size", "4"), ("--pp", "2"), ("--pipeline-parallel-size", "03"), ("--context", "8k"),
          ("-c", "32768"), ("--batch", "4"), ("--kv-dtype", "fp8"), ("--kv-cache-dtype", "int8"),
          ("--gpu-util", "0.8"), ("--gpu-memory-utilization", "0.9"), ("--max-num-seqs", "256"), ("--gpus", "8"),
          ("-q", "fp8"), ("--token", "hf_x"), ("--engine", "sglang"), ("--max-model-len", "auto"),
          ("--gpu-memory", "24GiB"), ("--revision", ""), ("--block-size", "32")]
_PLAIN_FLAGS = ["--json", "--brief", "--hub", "--offline", "--prefix-caching", "--no-prefix-caching", "--flashinfer",
                "--no-flashinfer", "--enforce-eager", "--enable-lora", "--expert-parallel", "--refresh"]
_ODD = [["-b", "x"], ["--batch", "1_0"], ["--layers", "-1"], ["--help"], ["-h"], ["--no-json"], ["--nonsense"],
        ["--"], ["--json=1"], ["-g=H100"], ["--gpu="], ["--json", "--json"], ["x/y"], ["--batch"]]


@st.composite
def _lines(draw):
    """``(argv, plain)``: an estimate line; ``plain``: built of forms the plain path reads (each option once)."""
    from kvplan.cli.flags import ESTIMATE_SPELLINGS

    units = []  # an option with its value, a flag, the model: in any order
    for flag, value in draw(st.lists(st.sampled_from(_PLAIN), max_size=6,
                                     unique_by=lambda fv: ESTIMATE_SPELLINGS[fv[0]].param)):
        joined = flag.startswith("--") and value and draw(st.booleans())  # `--revision=` is left to typer
        units.append([f"{flag}={value}"] if joined else [flag, value])
    units += [[flag] for flag in draw(st.lists(st.sampled_from(_PLAIN_FLAGS), max_size=3, unique=True))]
    units.append([draw(st.sampled_from(["meta-llama/Llama-3.1-8B", "./local"]))])
    odd = draw(st.lists(st.sampled_from(_ODD), max_size=2)) if draw(st.booleans()) else []
    units = draw(st.permutations(units))
    for extra in odd:  # anywhere, even between an option and its value
        units.insert(draw(st.integers(0, len(units))), extra)
    return ["estimate", *(w for unit in units for w in unit)], not odd


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=_lines())
def test_a_line_gives_the_command_what_typer_gives_it(monkeypatch, line):
    """The console entry point (the plain path where it reads the line, typer otherwise) and the typer app
    call the estimate command with the same arguments, or fail with the same code and message."""
    from kvplan.cli import app as typer_app, entry
    from kvplan.cli.flags import plain_estimate

    argv, plain = line
    assert plain_estimate(argv) is not None or not plain, argv  # every plain form is read
    assert _calls(monkeypatch, entry.main, argv) == _calls(monkeypatch, typer_app.main, argv), argv


@pytest.mark.parametrize("odd", _ODD, ids=" ".join)
def test_each_odd_form_alone_gives_what_typer_gives(monkeypatch, odd):
    from kvplan.cli import app as typer_app, entry

    for argv in (["estimate", "meta-llama/Llama-3.1-8B", *odd], ["estimate", *odd, "meta-llama/Llama-3.1-8B"]):
        assert _calls(monkeypatch, entry.main, argv) == _calls(monkeypatch, typer_app.main, argv), argv


def test_the_lines_people_type_take_the_plain_path():
    from kvplan.cli.flags import plain_estimate

    for line in ("estimate meta-llama/Llama-3.1-8B --gpu H100 --json",
                 "estimate Qwen/Qwen3-32B -g a100 --tp 2 --kv-dtype fp8 --batch 32 --json",
                 "estimate meta-llama/Llama-3.1-8B --context=128k --no-prefix-caching --gpu-memory-utilization 0.85",
                 "estimate --gpu H100,H200 meta-llama/Llama-3.1-8B --brief"):
        assert plain_estimate(line.split()) is not None, line
    for line in ("estimate", "estimate --help", "estimate M --gpu", "estimate M --json --json", "estimate M N",
                 "estimate M --batch 1_0", "estimate M -g=H100", "estimate M --json=1", "estimate M --layers -1",
                 "models", "estimate M -- --json", "gpus --json"):
        assert plain_estimate(line.split()) is None, line


@pytest.mark.parametrize("entry_point", ["kvplan.cli.entry", "kvplan.cli.app"])
def test_a_reader_that_leaves_ends_the_run_quietly(entry_point):
    """`kvplan estimate ... | head -1`: exit 1 and nothing on stderr, on the plain path as typer's does."""
    import subprocess
    import sys

    code = f"from {entry_point} import main; main(['estimate', 'meta-llama/Llama-3.1-8B', '--gpu', 'H100'])"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read()
    assert (p.wait(timeout=120), err) == (1, b"")


def test_the_plain_path_leaves_the_garbage_collector_as_it_found_it(monkeypatch):
    import gc

    from kvplan.cli import entry

    for argv in (["estimate", "meta-llama/Llama-3.1-8B", "--json"], ["estimate", "--help"], ["estimate", "nosuch"]):
        assert gc.isenabled()
        _calls(monkeypatch, entry.main, argv)
        assert gc.isenabled(), argv
    assert entry._AT_EXIT == [gc.freeze]  # registered once, however many runs


# every engine-facing hint in SGLang's own words: no vLLM flag or setting name in an SGLang answer
VLLM_NAMES = ("--max-model-len", "max_model_len", "--max-num-seqs", "max_num_seqs", "--gpu-memory-utilization",
              "gpu_memory_utilization", "--max-num-batched-tokens", "max_num_batched_tokens", "--block-size",
              "--enable-prefix-caching", "--enforce-eager", "--tensor-parallel-size", "--kv-cache-memory-bytes")
JSON_ENUM_KEYS = ("limited_by",)  # schema values (the answer's limit kind), not flags


def _json_strings(value, key=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_strings(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _json_strings(v, key)
    elif isinstance(value, str) and key not in JSON_ENUM_KEYS:
        yield value


@pytest.mark.parametrize("args", [
    ("openai/gpt-oss-120b", "--gpu", "H100", "--context", "32k"),
    ("google/gemma-3-27b-it", "--gpu", "H100", "--context", "32k"),
    ("mistralai/Mistral-7B-v0.1", "--gpu", "RTX-4090", "--context", "32k"),
    ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--batch", "4000"),
    ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--context", "200k"),
    ("meta-llama/Llama-3.1-70B", "--gpu", "H100", "--context", "8k"),
    ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--max-model-len", "auto"),
    ("meta-llama/Llama-3.1-8B", "--gpu", "H100", "--prefix-tokens", "2k", "--batch", "200"),
    ("Qwen/Qwen3-8B", "--gpu", "H100", "--max-running-requests", "8", "--batch", "16"),
    ("Qwen/Qwen3-8B", "--gpu", "L4", "--context-length", "32768", "--context", "8k", "--batch", "300"),
])
def test_sglang_answers_name_sglangs_own_flags(args):
    """SGLang's answers (text and JSON) name SGLang's flags and settings (--context-length, max_running_requests,
    mem_fraction_static, --page-size, ...), never vLLM's, whatever binds (the pool, the request limit, the length,
    a refusal, --max-model-len auto); kvplan takes the SGLang flags it prints as aliases of its own options."""
    for extra in ((), ("--json",)):
        result = run("estimate", *args, "--engine", "sglang", *extra)
        assert result.exit_code in (0, 1), result.output
        texts = list(_json_strings(json.loads(result.output))) if extra else [result.output]
        for text in texts:
            flat = " ".join(text.split())
            bad = [name for name in VLLM_NAMES if name in flat]
            assert not bad, (args, extra, bad, flat[:300])
        if not extra:
            assert "--context-length" in result.output or "context_length" in result.output


def test_sglang_hint_flags_are_accepted_back():
    """The flags an SGLang hint names re-plan as they say: --context-length N, --max-running-requests N."""
    result = run("estimate", "openai/gpt-oss-120b", "--gpu", "H100", "--context", "32k", "--engine", "sglang")
    needed = result.output.split("(needs --context-length ")[1].split(")")[0]
    again = run("estimate", "openai/gpt-oss-120b", "--gpu", "H100", "--engine", "sglang", "--context-length", needed,
                "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["answer"]["fits"]


@pytest.mark.parametrize("engine,kv", [("vllm", "int4"), ("vllm", "int8"), ("sglang", "int8"), ("sglang", "int4"),
                                       ("sglang", "fp16")])
def test_a_kv_dtype_the_engine_cannot_run_prints_no_launch_line(engine, kv):
    """A KV dtype with no --kv-cache-dtype spelling in the release: the answer stands as a what-if, the engine panel
    has no command to paste, and a note says why (with the release's choices)."""
    result = run("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", engine, "--kv-dtype", kv)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "--kv-cache-dtype" not in flat.split("serve:")[1].split("note:")[0]
    assert "serve: none:" in flat and "is a what-if" in flat
    assert "vllm serve" not in flat and "sglang.launch_server" not in flat


# ---------------------------------------------------------------------------------------------
# --help names the default GPU; shell completion offers GPU names, bundled models and dtypes


def test_help_names_the_default_gpu():
    from kvplan.options import DEFAULT_GPU

    import re

    r = runner.invoke(app, ["estimate", "--help"], env={"COLUMNS": "200"})
    assert f"(default {DEFAULT_GPU}, unless --gpu-memory is given)" in " ".join(re.sub("[│╭╮╰╯─]", " ", r.output).split())


def _completions(command: str, flag: str | None, incomplete: str) -> list[str]:
    """What the shell completes for ``kvplan COMMAND [FLAG] INCOMPLETE``: typer's completion as a shell runs it
    (zsh's protocol: the words in _TYPER_COMPLETE_ARGS, the values back in one ``_arguments`` line)."""
    import os
    import re
    import subprocess
    import sys

    words = " ".join(["kvplan", command, *(["x", flag] if flag else []), incomplete])
    env = {**os.environ, "_TYPER_COMPLETE_ARGS": words, "_KVPLAN_COMPLETE": "complete_zsh"}
    out = subprocess.run([sys.executable, "-m", "kvplan"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return re.findall(r'"([^"]*)"', out.stdout)


@pytest.mark.parametrize("command", ["estimate", "validate", "models show"])
def test_completion_offers_bundled_models(command):
    from kvplan.model.sources import bundled_ids

    got = _completions(command, None, "meta-llama/Llama-3.1-8")
    assert got and set(got) <= set(bundled_ids()) and "meta-llama/Llama-3.1-8B" in got


def test_every_option_with_names_completes_them():
    # the class: every estimate option (and each other spelling of it) whose kind has names to offer completes
    # them; a list option completes its last item
    from kvplan.cli.options import COMPLETIONS, split_flags
    from kvplan.options import CLI_OPTIONS

    named = [o for o in CLI_OPTIONS if o.kind in COMPLETIONS]
    assert {"gpu", "kv_dtype", "dtype", "engine", "usage_context", "speculative"} <= {o.name for o in named}
    for opt in named:
        own, others = split_flags(opt)
        for flag in [f for f in own if f.startswith("--")] + [f for f, negates in others if not negates]:
            assert _completions("estimate", flag, ""), (opt.name, flag)
    assert {"H20-96GB", "H200-SXM-141GB"} <= set(_completions("estimate", "--gpu", "H2"))
    assert _completions("estimate", "--gpu", "H100,mi3") and all(
        c.startswith("H100,mi3") for c in _completions("estimate", "--gpu", "H100,mi3"))
    assert set(_completions("estimate", "--kv-dtype", "fp8")) == {"fp8", "fp8_e4m3", "fp8_e5m2"}
    assert set(_completions("validate", "--kv-cache-dtype", "int")) == {"int8", "int4"}
    assert _completions("models show", "--kv-dtype", "b") == ["bf16"]
    assert _completions("estimate", "--engine", "s") == ["sglang"]


def test_completion_is_cheap():
    # a completion runs on every <TAB>: no torch, no Hub client, no pydantic
    import subprocess
    import sys

    code = ("import sys; from kvplan.cli.options import complete_gpu, complete_model, complete_kv_dtype; "
            "complete_gpu('h'); complete_model('q'); complete_kv_dtype('f'); "
            "print(sorted(m for m in ('torch', 'huggingface_hub', 'pydantic', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_command_summary_reads_as_one_paragraph():
    # `kvplan --help` broke validate's summary mid-sentence: a docstring's line break is kept by rich markup, so
    # each command's (and subcommand's) summary paragraph is written on one line
    import typer

    def walk(group, path):
        for name, cmd in getattr(group, "commands", {}).items():
            yield f"{path} {name}", cmd
            yield from walk(cmd, f"{path} {name}")

    seen = 0
    for path, cmd in walk(typer.main.get_command(app), "kvplan"):
        summary = (cmd.help or "").strip().split("\n\n")[0]
        assert summary and "\n" not in summary, (path, summary)
        seen += 1
    assert seen >= 11
