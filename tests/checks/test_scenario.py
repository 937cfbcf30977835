"""YAML scenario files: every mistake is ONE line with file:line:col, the key path, the value and what was expected;
exit 2 and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.checks.scenario import load_capacity, load_whatif
from kvplan.io.yamldoc import ScenarioFileError
from kvplan.options import YAML_OPTIONS

from entry_point import kvplan as run

runner = CliRunner()

GOOD_CHECK = """\
defaults:
  model: meta-llama/Llama-3.1-8B
  gpu: H100
checks:
  - name: chat
    require: {concurrency: 4}
"""


def write(tmp_path: Path, text: str, name: str = "file.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def check_error(tmp_path: Path, text: str) -> str:
    """Run `kvplan check` on ``text`` with --junit-xml; assert exit 2, one line, and a JUnit file with one
    error case carrying that line (CI's publish step always finds a report); return the line."""
    import xml.etree.ElementTree as ET

    path = write(tmp_path, text)
    junit = tmp_path / "junit.xml"
    r = runner.invoke(app, ["check", str(path), "--offline", "--junit-xml", str(junit)])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("errors") == "1" and suite.get("tests") == "1"
    error = suite.find("testcase/error")
    assert lines[0] == "kvplan: error: " + error.text
    junit.unlink()
    return lines[0]


def report_error(tmp_path: Path, text: str) -> str:
    """Run `kvplan report` on ``text`` (outputs under out/); assert exit 2, one line, nothing written."""
    path = write(tmp_path, text)
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 2, r.output
    assert not (tmp_path / "out").exists()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_a_good_file_loads_with_parsed_values(tmp_path):
    path = write(tmp_path, """\
        defaults:
          model: meta-llama/Llama-3.1-8B
          context: 8k
          kv_budget: 24GiB
          gpus: 2
          tp: 2
        checks:
          - name: a
            context: 32k
            require: {concurrency: 3, headroom_pct: 5}
        """)
    cap = load_capacity(path)
    (c,) = cap.checks
    assert c.values["context"] == 32 * 1024  # '32k' = 32 x 1024 tokens, the check overrides the default 8k
    assert c.values["kv_budget"] == "24GiB"  # sizes stay as typed; options_from_values parses them
    assert c.values["gpu_count"] == 2 and c.values["gpu"] == "H100"  # `gpus` is --gpus; the GPU defaults to H100
    assert c.require.concurrency == 3 and c.require.headroom_pct == 5.0
    assert (c.where.line, c.where.col) == (8, 5)  # the check's entry: line 8, column 5 ("- name" dash + 2)


def test_typo_in_require_names_line_column_and_suggests(tmp_path):
    line = check_error(tmp_path, GOOD_CHECK.replace("concurrency: 4", "concurency: 4"))
    assert "file.yaml:6:15:" in line  # `require: {concurency` -> the key starts at column 15 of line 6
    assert "checks[0].require.concurency" in line and "did you mean 'concurrency'?" in line


def test_unknown_top_level_and_option_keys(tmp_path):
    line = check_error(tmp_path, GOOD_CHECK.replace("  gpu: H100", "  gpu: H100\n  kv_dtyp: fp8"))
    assert "file.yaml:4:3:" in line and "defaults.kv_dtyp" in line and "did you mean 'kv_dtype'?" in line
    line = check_error(tmp_path, GOOD_CHECK + "extra: 1\n")
    assert "file.yaml:7:1:" in line and "unknown key 'extra'" in line


def test_wrong_type_says_value_and_expectation(tmp_path):
    line = check_error(tmp_path, GOOD_CHECK.replace("concurrency: 4", "concurrency: many"))
    assert "file.yaml:6:28:" in line and "checks[0].require.concurrency" in line
    assert "'many'" in line and "expected a positive integer" in line


@pytest.mark.parametrize("value, expect", [("-8", "expected a token count"), ("0", "expected a token count"),
                                            ("8q", "unknown suffix")])
def test_bad_token_counts(tmp_path, value, expect):
    line = check_error(tmp_path, GOOD_CHECK.replace("  gpu: H100", f"  gpu: H100\n  context: {value}"))
    assert "file.yaml:4:12:" in line and "defaults.context" in line and expect in line


@pytest.mark.parametrize("value", ["-24GiB", "0", "0GiB", "-3"])
def test_negative_or_zero_sizes(tmp_path, value):
    line = check_error(tmp_path, GOOD_CHECK.replace("  gpu: H100", f"  gpu: H100\n  kv_budget: {value}"))
    assert "file.yaml:4:14:" in line and "defaults.kv_budget" in line and "expected a positive size" in line


def test_unknown_gpu_lists_the_closest(tmp_path):
    line = check_error(tmp_path, GOOD_CHECK.replace("gpu: H100", "gpu: H1000"))
    assert "file.yaml:3:8:" in line and "unknown GPU 'H1000'" in line and "H100-SXM-80GB" in line


def test_unknown_model_lists_the_closest(tmp_path):
    line = check_error(tmp_path, GOOD_CHECK.replace("model: meta-llama/Llama-3.1-8B", "model: Llama-3.1-8C"))
    assert "file.yaml:2:10:" in line and "'Llama-3.1-8C'" in line and "meta-llama/Llama-3.1-8B" in line


def test_unknown_hub_model_offline_is_exit_2_with_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    line = check_error(tmp_path, GOOD_CHECK + "  - name: other\n    model: meta-llama/Llama-3.1-8C\n    require: {fits: true}\n")
    assert "file.yaml:8:12:" in line and "'meta-llama/Llama-3.1-8C'" in line and "not in the Hugging Face cache" in line
    assert "closest bundled: meta-llama/Llama-3.1-8B" in line


def test_duplicate_check_names(tmp_path):
    line = check_error(tmp_path, GOOD_CHECK + "  - name: chat\n    require: {fits: true}\n")
    assert "file.yaml:7:11:" in line and "duplicate check name 'chat'" in line and "line 5" in line


def test_duplicate_yaml_keys(tmp_path):
    line = check_error(tmp_path, GOOD_CHECK.replace("  gpu: H100", "  gpu: H100\n  gpu: A100"))
    assert "file.yaml:4:3:" in line and "duplicate key 'gpu' (first at line 3)" in line


def test_not_yaml_and_empty_and_not_a_mapping(tmp_path):
    line = check_error(tmp_path, "defaults:\n  model: [unclosed\nchecks: x\n")
    assert "file.yaml:3:" in line and "not valid YAML" in line
    line = check_error(tmp_path, "")
    assert "file.yaml:1:1:" in line and "empty" in line
    line = check_error(tmp_path, "# only a comment\n")
    assert "file.yaml:1:1:" in line and "empty" in line
    line = check_error(tmp_path, "- a\n- b\n")
    assert "file.yaml:1:1:" in line and "expected a mapping" in line


def test_missing_and_empty_requirements(tmp_path):
    line = check_error(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nchecks:\n  - name: a\n")
    assert "file.yaml:3:5:" in line and "checks[0].require: required key missing" in line
    line = check_error(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nchecks:\n  - name: a\n    require: {}\n")
    assert "file.yaml:4:14:" in line and "nothing required" in line
    line = check_error(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nchecks: []\n")
    assert "file.yaml:2:9:" in line and "at least one" in line
    line = check_error(tmp_path, "checks:\n  - name: a\n    require: {fits: true}\n")
    assert "file.yaml:2:5:" in line and "names no model" in line


def test_option_contradiction_points_at_the_key(tmp_path):
    line = check_error(tmp_path, GOOD_CHECK + "  - name: bad-tp\n    tp: 3\n    require: {fits: true}\n")
    assert "file.yaml:8:9:" in line and "bad-tp" in line and "tp 3 does not divide" in line and "--" not in line


@pytest.mark.parametrize(("key", "value", "words"), [
    ("tp", 3, "tp 3 does not divide"),
    ("kv_budget", "900GiB", "kv_budget 900.00 GiB does not fit"),
    ("prefix_tokens", 9000, "prefix_tokens 9000 exceeds context 8192"),
    ("gpu_memory", "200GiB", "gpu_memory 200.00 GiB is more than"),
    ("max_num_batched_tokens", 16, "max_num_batched_tokens"),
])
def test_a_planning_error_names_the_file_line_and_key(tmp_path, key, value, words):
    # the class: what only planning finds (a contradiction, a budget past the GPU) is located at the key that
    # caused it and written in the file's words, in a capacity file and in a workload file alike
    line = check_error(tmp_path, GOOD_CHECK + f"  - name: bad\n    context: 8k\n    {key}: {value}\n"
                                              "    require: {fits: true}\n")
    assert "file.yaml:9:" in line and words in line and "--" not in line, line
    if key == "prefix_tokens":  # a workload's prefixes are its own key
        return
    work = write(tmp_path, f"model: meta-llama/Llama-3.1-8B\ngpu: H100\ncontext: 8k\n{key}: {value}\n"
                           "arrivals: {rate: 1}\nnum_requests: 5\nprompt_tokens: 100\noutput_tokens: 10\n", "w.yaml")
    r = runner.invoke(app, ["simulate", str(work), "--offline"])
    assert r.exit_code == 2, r.output
    assert "w.yaml:4:" in r.stderr and words in r.stderr and "--" not in r.stderr.replace("(--json", ""), r.stderr


WHATIF = """\
defaults:
  model: meta-llama/Llama-3.1-8B
sweep:
  gpu: [H100, L4]
  context: [4k, 8k]
outputs: [out/r.csv, out/r.html]
"""


def test_whatif_errors(tmp_path):
    line = report_error(tmp_path, WHATIF.replace("  gpu: [H100, L4]\n  context: [4k, 8k]\n", "  {}\n").replace("sweep:\n  {}", "sweep: {}"))
    assert "file.yaml:3:8:" in line and "empty sweep" in line
    line = report_error(tmp_path, WHATIF.replace("context: [4k, 8k]", "context: []"))
    assert "file.yaml:5:12:" in line and "sweep.context" in line and "non-empty list" in line
    line = report_error(tmp_path, WHATIF.replace("context: [4k, 8k]", "context: 8k"))
    assert "file.yaml:5:12:" in line and "non-empty list" in line
    line = report_error(tmp_path, WHATIF.replace("context: [4k, 8k]", "contxt: [4k, 8k]"))
    assert "file.yaml:5:3:" in line and "did you mean 'context'?" in line
    line = report_error(tmp_path, WHATIF.replace("out/r.html", "out/r.pdf"))
    assert "file.yaml:6:22:" in line and "outputs[1]" in line and ".md, .html, .csv or .json" in line
    line = report_error(tmp_path, WHATIF.replace("gpu: [H100, L4]", "gpu: [H100, L44]"))
    assert "file.yaml:4:15:" in line and "sweep.gpu[1]" in line and "unknown GPU 'L44'" in line
    line = report_error(tmp_path, WHATIF + "zip: [[gpu, context2]]\n")
    assert "file.yaml:7:13:" in line and "'context2' is not a sweep axis" in line
    line = report_error(tmp_path, WHATIF.replace("context: [4k, 8k]", "context: [4k, 8k, 16k]") + "zip: [[gpu, context]]\n")
    assert "file.yaml:7:7:" in line and "differ in length" in line
    line = report_error(tmp_path, "title: x\n")
    assert "nothing to report" in line
    line = report_error(tmp_path, WHATIF.replace("gpu: [H100, L4]", "tp: [1, 3]"))
    assert "file.yaml:3:1:" in line or "file.yaml:4:" in line
    assert "tp 3 does not divide" in line and "--tp" not in line  # in the file's words


def test_schema_command_prints_json_schema():
    r = runner.invoke(app, ["schema", "capacity"])
    assert r.exit_code == 0, r.output
    schema = json.loads(r.stdout)
    assert schema["additionalProperties"] is False and set(schema["required"]) == {"checks"}
    check = schema["$defs"]["Check"]
    assert check["additionalProperties"] is False and "require" in check["properties"] and "kv_budget" in check["properties"]
    assert "concurrency" in schema["$defs"]["RequireModel"]["properties"]
    r = runner.invoke(app, ["schema", "whatif"])
    assert r.exit_code == 0 and "sweep" in json.loads(r.stdout)["properties"]
    r = runner.invoke(app, ["schema", "workload"])  # kvplan simulate's file (errors point users here)
    assert r.exit_code == 0 and "arrivals" in json.loads(r.stdout)["properties"]
    r = runner.invoke(app, ["schema", "nope"])
    assert r.exit_code == 2 and "unknown schema 'nope'" in r.stderr


def test_scenario_errors_are_located(tmp_path):
    path = write(tmp_path, GOOD_CHECK.replace("gpu: H100", "gpu: 7"))
    with pytest.raises(ScenarioFileError) as info:
        load_capacity(path)
    assert (info.value.where.line, info.value.where.col) == (3, 8)
    path = write(tmp_path, WHATIF.replace("context: [4k, 8k]", "context: [4k, -1]"))
    with pytest.raises(ScenarioFileError) as info:
        load_whatif(path)
    assert (info.value.where.line, info.value.where.col) == (5, 17)


def test_import_cli_does_not_import_pydantic():
    code = "import sys, kvplan.cli.app; bad = [m for m in ('pydantic', 'matplotlib', 'torch') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# files that used to end in a traceback (exit 1): one line, exit 2, and a KvplanError from the API


def _bytes_error(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "file.yaml"
    path.write_bytes(data)
    r = runner.invoke(app, ["check", str(path), "--offline"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvplan: error:"), r.stderr
    from kvplan.errors import KvplanError

    with pytest.raises(KvplanError):
        load_capacity(path)
    return lines[0]


def test_yaml_starting_with_a_nul_byte(tmp_path):
    line = _bytes_error(tmp_path, b"\0" + GOOD_CHECK.encode())
    assert "file.yaml: binary data (a NUL byte at offset 0)" in line


def test_yaml_that_is_not_utf8(tmp_path):
    line = _bytes_error(tmp_path, GOOD_CHECK.replace("H100", "H\xff").encode("latin-1"))
    assert "not valid UTF-8 (byte 0xff at offset" in line


@pytest.mark.parametrize("open_, close", [("[", "]"), ("{a: ", "}")])
def test_yaml_nested_5000_deep(tmp_path, open_, close):
    line = _bytes_error(tmp_path, ("checks: " + open_ * 5000 + "1" + close * 5000 + "\n").encode())
    assert "file.yaml:1:" in line and "nested more than 64 levels deep" in line


def test_yaml_bomb_is_refused_before_it_expands(tmp_path):
    # "billion laughs": 10 levels of 10 aliases each = 10^10 values once expanded
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    text = "\n".join(lines) + "\ndefaults: {model: meta-llama/Llama-3.1-8B}\nchecks: [{name: x, require: {fits: true}, tp: *a9}]\n"
    line = _bytes_error(tmp_path, text.encode())
    assert "expands to more than 1,000,000 values" in line


def test_a_folder_instead_of_a_file(tmp_path):
    r = runner.invoke(app, ["check", str(tmp_path), "--offline"])
    assert r.exit_code == 2 and "is a directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_huge_scalar_is_shown_shortened(tmp_path):
    line = _bytes_error(tmp_path, ('"' + "x" * 100_000 + '"\n').encode())
    assert "expected a mapping" in line and len(line) < 300


def test_schema_takes_json_like_every_command():
    # docs/cli.md: every command takes --json (schema always prints JSON)
    r = runner.invoke(app, ["schema", "whatif", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["title"] == "kvplan what-if file"


def test_every_mistake_in_a_file_is_listed(tmp_path):
    # used to print the first and "(+3 more)"; now each is its own located line (up to 20), in file order,
    # and the JUnit error case and the GitHub annotations carry them all
    import xml.etree.ElementTree as ET

    path = write(tmp_path, """\
        defaults:
          model: meta-llama/Llama-3.1-8B
          contxt: 8k
        checks:
          - name: a
            require: {concurency: 4}
          - name: b
            tp: zero
            require: {fits: maybe}
        """)
    junit = tmp_path / "junit.xml"
    r = runner.invoke(app, ["check", str(path), "--offline", "--junit-xml", str(junit)], env={"GITHUB_ACTIONS": "true"})
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    import re

    assert [re.search(r"file\.yaml:(\d+):(\d+): ", line).groups() for line in lines] == [
        ("3", "3"), ("6", "15"), ("8", "9"), ("9", "21")]
    assert all(line.startswith("kvplan: error: ") for line in lines) and "more" not in r.stderr
    assert "'zero': expected a positive integer" in lines[2] and "'maybe': expected true or false" in lines[3]
    assert len(ET.parse(junit).getroot().find("testsuite/testcase/error").text.splitlines()) == 4
    assert r.stdout.count("::error file=") == 4


CHECK_MISTAKES = [
    # (check entry, the mistake it makes, what its error line says) - each kind of mistake a check can make
    ("  - name: a\n    require: {concurrency: 4}\n", None, None),  # a good check, named 'a'
    ("  - name: a\n    require: {fits: true}\n", "duplicate name", "duplicate check name 'a'"),
    ("  - name: b\n    tp: zero\n    require: {fits: true}\n", "schema", "'zero': expected a positive integer"),
    ("  - name: c\n    require: {}\n", "nothing required", "nothing required"),
    ("  - name: d\n    model: Llama-3.1-8C\n    require: {fits: true}\n", "unknown model", "'Llama-3.1-8C'"),
    ("  - name: e\n    tp: 3\n    require: {fits: true}\n", "option contradiction", "tp 3 does not divide"),
    ("  - name: a\n    require: {fits: true}\n", "duplicate name", "duplicate check name 'a'"),
]


@pytest.mark.parametrize("drop", [None] + [m for _, m, _ in CHECK_MISTAKES if m])
def test_every_kind_of_check_mistake_is_listed_with_the_others(tmp_path, drop):
    # a duplicate check name was raised alone, hiding the file's other mistakes; and the mistakes found after the
    # schema (nothing required, an unknown model, contradicting options) were raised one at a time. Each kind,
    # with or without the others, is listed together with every other mistake of the file, in file order.
    import re

    entries = [(text, needle) for text, mistake, needle in CHECK_MISTAKES if mistake is None or mistake != drop]
    path = write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B, gpu: H100}\nchecks:\n"
                 + "".join(text for text, _ in entries))
    r = runner.invoke(app, ["check", str(path), "--offline"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    needles = [n for _, n in entries if n]
    assert len(lines) == len(needles), r.stderr
    for line, needle in zip(lines, needles):
        assert line.startswith("kvplan: error: ") and needle in line, (needle, line)
    found = [tuple(map(int, re.search(r"file\.yaml:(\d+):(\d+): ", line).groups())) for line in lines]
    assert found == sorted(found)


def test_errors_past_the_limit_are_counted(tmp_path):
    from kvplan.io.yamldoc import MAX_FILE_ERRORS

    checks = "".join(f"  - {{name: c{i}, tp: x, require: {{fits: true}}}}\n" for i in range(MAX_FILE_ERRORS + 5))
    path = write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nchecks:\n" + checks)
    r = runner.invoke(app, ["check", str(path), "--offline"])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == MAX_FILE_ERRORS + 1 and lines[-1].endswith("5 more mistakes not shown (fix these first)")


def test_an_unknown_model_still_writes_junit(tmp_path):
    import xml.etree.ElementTree as ET

    path = write(tmp_path, GOOD_CHECK.replace("meta-llama/Llama-3.1-8B", "nobody/NoSuchModel-7B"))
    junit = tmp_path / "junit.xml"
    r = runner.invoke(app, ["check", str(path), "--offline", "--junit-xml", str(junit)])
    assert r.exit_code == 2
    case = ET.parse(junit).getroot().find("testsuite/testcase")
    assert case.get("name") == "capacity file is valid" and "NoSuchModel" in case.find("error").get("message")


def test_a_gpu_name_under_gpus_suggests_gpu(tmp_path):
    (tmp_path / "w.yaml").write_text("defaults: {model: meta-llama/Llama-3.1-8B}\nsweep:\n  gpus: [H100]\n")
    r = run("report", str(tmp_path / "w.yaml"))
    assert r.returncode == 2 and "did you mean gpu?" in r.stderr


def _past_the_limit(opt) -> object:
    """A YAML value one unit past ``opt``'s limit: a count or token count + 1, a size in GiB twice the bound."""
    from kvplan.units import GiB

    return f"{opt.limit * 2 // GiB}GiB" if opt.kind.startswith("size") else opt.limit + 1


BOUNDED_OPTIONS = [o for o in YAML_OPTIONS if o.limit is not None]


@pytest.mark.parametrize("key, value", [("concurrency", 1 << 20 | 1), ("context", (1 << 32) + 1),
                                        ("kv_tokens", (1 << 32) + 1)])
def test_a_requirement_past_its_bound_is_reported_at_its_key(tmp_path, key, value):
    # a huge require.concurrency was "invalid --batch ..." at the check's line: the batch it becomes was checked,
    # not the key the user wrote; every bounded requirement is checked at its own key, in the file's words
    line = check_error(tmp_path, GOOD_CHECK.replace("{concurrency: 4}", f"{{{key}: {value}}}"))
    assert f"file.yaml:6:" in line and f"checks[0].require.{key}" in line and "must be at most" in line, line
    assert "--" not in line, line


@pytest.mark.parametrize("opt", BOUNDED_OPTIONS, ids=lambda o: o.name)
def test_every_bounded_option_past_its_bound_is_reported_at_its_key(tmp_path, opt):
    # the class of the same mistake: each option the CLI bounds is bounded in a file too, located at the key
    # (line 7: the check's own key) and named as the file names it, never by a CLI flag
    value = _past_the_limit(opt)
    line = check_error(tmp_path, GOOD_CHECK + f"  - name: big\n    {opt.name}: {value}\n    require: {{fits: true}}\n")
    assert f"file.yaml:8:" in line and f"checks[1].{opt.name}" in line and "must be at most" in line, line
    assert opt.flag not in line, line
    swept = report_error(tmp_path, f"defaults: {{model: meta-llama/Llama-3.1-8B}}\nsweep:\n  {opt.name}: [{value}]\n"
                                   "outputs: [out/r.csv]\n")
    assert f"sweep.{opt.name}" in swept and "must be at most" in swept and opt.flag not in swept, swept
