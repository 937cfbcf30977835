"""Capacity checks: verdicts with hand-derived numbers, suggestions found by re-planning, exit codes,
JUnit XML, JSON and GitHub annotations."""

from __future__ import annotations

import json
import shutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.checks.capacity import run_checks
from kvplan.gpus import find_gpu, load_gpus
from kvplan.planning.plan import estimate, options_from_values
from kvplan.cli.app import app
from kvplan.checks.scenario import load_capacity

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"

# Llama-3.1-8B in bf16: 32 layers x 8 kv heads x 128 x 2 B x 2 (K and V) = 131,072 B/token; a 16-token block
# is 2 MiB. An explicit KV budget of 10 GiB holds 10 GiB / 2 MiB = 5,120 blocks (one is vLLM's null block).
# An 8k request needs 8,192 / 16 = 512 blocks: (5,120 - 1) // 512 = 9 requests fit.
BASE = """\
defaults:
  model: meta-llama/Llama-3.1-8B
  gpu: H100
  kv_budget: 10GiB
  context: 8k
checks:
"""


def write(tmp_path: Path, checks: str) -> Path:
    path = tmp_path / "capacity.yaml"
    path.write_text(BASE + textwrap.indent(textwrap.dedent(checks), "  "), encoding="utf-8")
    return path


def results(tmp_path: Path, checks: str):
    return run_checks(load_capacity(write(tmp_path, checks)), offline=True).results


def test_concurrency_verdict_and_suggestions(tmp_path):
    (ok, short) = results(tmp_path, """\
        - name: nine
          require: {concurrency: 9}
        - name: ten
          require: {concurrency: 10}
        """)
    assert ok.passed and ok.outcomes[0].actual == 9 and ok.outcomes[0].margin == 0
    o = short.outcomes[0]
    assert not short.passed and (o.actual, o.margin) == (9, -1)
    text = "\n".join(o.suggestions)
    # 10 requests fit when each needs <= 5,119 // 10 = 511 blocks: context <= 511 x 16 = 8,176 tokens
    assert "shorter context: context: 8176 (was 8192)" in text
    # fp8 halves the block to 1 MiB: 10,240 blocks, (10,240 - 1) // 512 = 19 requests
    assert "kv_dtype: fp8 (concurrency 19 requests)" in text
    # tp 2 halves the KV heads per GPU (the budget is per GPU): also 19 requests
    assert "more tensor parallelism: tp: 2 (concurrency 19 requests)" in text
    # an explicit per-GPU KV budget does not grow with the GPU: no GPU helps
    assert "another GPU" not in text


def test_headroom_context_kv_tokens_and_engine_start(tmp_path):
    head9, head8, ctx, ctx_short, kv, start = results(tmp_path, """\
        - name: head9
          batch: 9
          require: {headroom_pct: 10}
        - name: head8
          batch: 8
          require: {headroom_pct: 10}
        - name: ctx
          batch: 2
          require: {context: 40944}
        - name: ctx-short
          batch: 2
          require: {context: 40945}
        - name: kv
          require: {kv_tokens: 81920}
        - name: start
          context: 128k
          require: {engine_starts: true}
        """)
    # 9 x 512 = 4,608 of 5,119 usable blocks: 511 free = 9.98% < 10%; fewer requests: 8 leave 1,023 = 19.98%
    assert not head9.passed and round(head9.outcomes[0].actual, 2) == 9.98
    assert "fewer requests: batch: 8 (was 9)" in head9.outcomes[0].suggestions
    assert head8.passed and round(head8.outcomes[0].actual, 2) == 19.98
    # 2 requests of L tokens: 2 x ceil(L / 16) <= 5,119 -> ceil(L / 16) <= 2,559 -> L <= 40,944
    assert ctx.passed and ctx.outcomes[0].actual == 40_944
    assert not ctx_short.passed and ctx_short.outcomes[0].margin == -1
    assert "fewer requests: batch: 1 (was 2)" in ctx_short.outcomes[0].suggestions
    # vLLM's KV cache size: 5,120 blocks x 8,192 tokens // 512 blocks per request = 81,920 tokens
    assert kv.passed and kv.outcomes[0].actual == 81_920
    # one 128k request needs 8,192 blocks > 5,119; the longest that starts is 5,119 x 16 = 81,904 tokens
    assert not start.passed and "81,904" in start.outcomes[0].message
    assert "one 131,072-token request needs 16.00 GiB KV cache" in start.outcomes[0].message  # vLLM's reason
    # no max_model_len in the check: it is the context, so the context is what to shorten
    assert "shorter max_model_len: context: 81904 (was 131072)" in start.outcomes[0].suggestions


def test_suggested_gpu_is_the_smallest_that_passes(tmp_path):
    (r,) = run_checks(load_capacity(_no_budget(tmp_path)), offline=True).results
    gpu = [s for s in r.outcomes[0].suggestions if s.startswith("another GPU")]
    assert len(gpu) == 1
    name = gpu[0].split("gpu: ")[1].split(" (")[0]

    def requests(gpu_name: str) -> int:
        values = {"model": "meta-llama/Llama-3.1-8B", "gpu": gpu_name, "context": "8k", "batch": 64}
        return estimate(options_from_values(values)).answer.max_requests

    # re-planning on the suggested GPU passes; every catalogue GPU with more memory than the H100 but less
    # than the suggested one fails
    assert requests(name) >= 64
    h100, chosen = find_gpu("H100").memory_bytes, find_gpu(name).memory_bytes
    smaller = [g for g in load_gpus() if g.memory_bytes and not g.is_cpu and h100 < g.memory_bytes < chosen]
    assert all(requests(g.name) < 64 for g in smaller)


def _no_budget(tmp_path: Path) -> Path:
    path = tmp_path / "nobudget.yaml"
    path.write_text("defaults: {model: meta-llama/Llama-3.1-8B, gpu: H100, context: 8k}\n"
                    "checks:\n  - name: big\n    require: {concurrency: 64}\n", encoding="utf-8")
    return path


def test_example_passes_as_is(tmp_path):
    shutil.copy(EXAMPLES / "capacity.yaml", tmp_path / "capacity.yaml")
    junit = tmp_path / "junit.xml"
    r = runner.invoke(app, ["check", str(tmp_path / "capacity.yaml"), "--offline", "--junit-xml", str(junit)])
    assert r.exit_code == 0, r.output
    assert "4 of 4 checks passed" in r.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.iter("testcase")] == [
        "chat-48-at-8k", "long-context-128k", "fp8-kv-doubles-the-pool", "qwen3-32b-on-two-a100s"]


def test_failing_check_exits_1_with_junit_json_and_suggestion(tmp_path):
    path = write(tmp_path, """\
        - name: fits
          require: {concurrency: 9}
        - name: too-many
          require: {concurrency: 10}
        """)
    junit = tmp_path / "junit.xml"
    r = runner.invoke(app, ["check", str(path), "--offline", "--junit-xml", str(junit)])
    assert r.exit_code == 1, r.output
    assert "FAIL" in r.stdout and "to pass, any one of" in r.stdout and "kv_dtype: fp8" in r.stdout
    assert "1 of 2 checks passed" in r.stdout
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("tests") == "2" and root.get("failures") == "1"
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["fits"].find("failure") is None
    failure = cases["too-many"].find("failure")
    assert "got 9 requests" in failure.get("message") and "shorter context: context: 8176" in failure.text
    assert cases["too-many"].get("line") == "9" and cases["too-many"].get("file").endswith("capacity.yaml")

    r = runner.invoke(app, ["check", str(path), "--offline", "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["passed"] is False and doc["summary"] == {"checks": 2, "passed": 1, "failed": 1}
    req = doc["checks"][1]["requirements"][0]
    assert (req["requirement"], req["required"], req["actual"], req["margin"], req["passed"]) == ("concurrency", 10, 9, -1, False)
    assert any("fp8" in s for s in req["suggestions"])
    assert doc["checks"][1]["plan"]["pool"]["num_blocks"] == 5120


def test_github_annotations_point_at_the_failing_check(tmp_path):
    path = write(tmp_path, """\
        - name: fits
          require: {concurrency: 9}
        - name: too-many
          require: {concurrency: 10}
        """)
    r = runner.invoke(app, ["check", str(path), "--offline"], env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)})
    assert r.exit_code == 1
    lines = [line for line in r.stdout.splitlines() if line.startswith("::")]
    assert len(lines) == 1
    # file relative to the workspace, the check's line (9), title with ':' escaped as %3A, message after '::'
    assert lines[0].startswith("::error file=capacity.yaml,line=9,col=5,title=kvplan check failed%3A too-many::")
    assert "got 9 requests" in lines[0] and "\n" not in lines[0]
    r = runner.invoke(app, ["check", str(path), "--offline"], env={"GITHUB_ACTIONS": ""})
    assert "::error" not in r.stdout


def test_invalid_file_annotation_in_github_actions(tmp_path):
    path = write(tmp_path, "- name: x\n  require: {concurrenc: 1}\n")
    r = runner.invoke(app, ["check", str(path), "--offline"], env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)})
    assert r.exit_code == 2
    assert r.stdout.startswith("::error file=capacity.yaml,line=8,col=15,title=kvplan%3A invalid capacity file::checks[0].require.concurrenc")


def test_per_check_revision_is_honoured(tmp_path, hub):
    """Two checks on one Hub repo at two revisions plan two different specs (4 vs 6 layers)."""
    try:
        from tests.hub_emulator import VirtualFile
    except ImportError:  # pragma: no cover - depends on how pytest was started
        from hub_emulator import VirtualFile
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096,
              "torch_dtype": "bfloat16", "vocab_size": 1000, "intermediate_size": 512}
    weights = VirtualFile.safetensors({"model.embed_tokens.weight": ("BF16", [1000, 256])}, {"format": "pt"})
    hub.add_repo("acme/tiny", {"config.json": config, "model.safetensors": weights}, refs=("main", "v1"))
    hub.add_commit("acme/tiny", {"config.json": {**config, "num_hidden_layers": 6}, "model.safetensors": weights}, refs=("v2",))
    path = tmp_path / "capacity.yaml"
    path.write_text("defaults: {model: acme/tiny, gpu: H100, kv_budget: 1GiB, context: 1k}\nchecks:\n"
                    "  - {name: v1, revision: v1, require: {fits: true}}\n"
                    "  - {name: v2, revision: v2, require: {fits: true}}\n", encoding="utf-8")
    r = runner.invoke(app, ["check", str(path), "--json"])
    assert r.exit_code == 0, r.output
    per_token = [c["plan"]["per_token"]["kv_bytes_per_token_gpu"] for c in json.loads(r.stdout)["checks"]]
    # 2 kv heads x (256 / 8 = 32) head_dim x 2 B x 2 (K, V) = 256 B per layer: 4 layers = 1,024; 6 layers = 1,536
    assert per_token == [1024, 1536]


def test_each_requirement_reads_each_word_once(tmp_path):
    """The table's requirement column: the key and its condition, no word twice ("fits 1 x 8,192 fits" was)."""
    from kvplan.checks.capacity import requirement_text

    report = run_checks(load_capacity(write(tmp_path, """\
        - name: every-kind
          batch: 2
          require: {concurrency: 2, context: 4k, kv_tokens: 1000, headroom_pct: 1, fits: true, engine_starts: true}
        - name: the-negatives
          batch: 64
          require: {fits: false, engine_starts: true}
        """)), offline=True)
    texts = [requirement_text(o.requirement, o.required, r.plan) for r in report.results for o in r.outcomes]
    assert texts == [
        "concurrency >= 2 requests at 8,192 tokens",
        "context >= 4,096 tokens at batch 2",
        "kv_tokens >= 1,000 KV tokens (max_model_len 8,192)",
        "headroom_pct >= 1% free after 2 x 8,192",
        "2 x 8,192 fits",
        "engine starts at max_model_len 8,192",
        "64 x 8,192 does not fit",
        "engine starts at max_model_len 8,192",
    ]
    for text in texts:
        words = [w for w in text.split() if w.isalpha()]
        assert len(words) == len(set(words)), text
    r = runner.invoke(app, ["check", str(tmp_path / "capacity.yaml"), "--offline"], env={"COLUMNS": "120"})
    assert "2 x 8,192 fits" in r.stdout and "fits 2 x" not in r.stdout and "engine_starts engine" not in r.stdout


# ---------------------------------------------------------------------------------------------
# --conservative: each suggestion planned fresh and judged at its own low end (not the check's pinned budget)

CONSERVATIVE = """\
defaults: {context: 16k}
checks:
  - {name: tp2-70b, model: meta-llama/Llama-3.1-70B, gpu: H100, tp: 2, require: {concurrency: 40}}
  - {name: one-8b, model: meta-llama/Llama-3.1-8B, gpu: H100, prefix_tokens: 2k, prefix_caching: false,
     require: {concurrency: 48}}
  - {name: qwen-sglang, model: Qwen/Qwen3-32B, gpu: A100-40GB, engine: sglang, require: {concurrency: 24}}
"""


def _conservative(tmp_path: Path):
    path = tmp_path / "conservative.yaml"
    path.write_text(CONSERVATIVE, encoding="utf-8")
    return path, run_checks(load_capacity(path), offline=True, conservative=True)


def test_conservative_suggestions_are_judged_at_their_own_low_end(tmp_path):
    """Each "to pass" change, applied to the check's own options and planned fresh, passes at the low end of its
    own range with the very figure the suggestion prints (the old code carried the check's low-end KV budget
    into every re-plan: "tp: 4 (concurrency 14 requests)" where tp 4's own low end is 44)."""
    import re

    import yaml

    from kvplan.checks.capacity import low_end
    from kvplan.model.sources import load_spec
    from kvplan.planning.plan import plan_for_spec

    path, report = _conservative(tmp_path)
    checks = {c["name"]: c for c in yaml.safe_load(CONSERVATIVE)["checks"]}
    seen = set()
    for result in report.results:
        assert not result.passed and result.judged == "low end"
        (o,) = result.outcomes
        for s in o.suggestions:
            m = re.fullmatch(r"(another GPU|more tensor parallelism|fp8 KV cache|smallest deployment \(kvplan size\)): (.+) "
                         r"\(concurrency (\d+) requests\)", s)
            if not m:
                continue
            seen.add(m[1])
            values = {k: v for k, v in checks[result.name].items() if k not in ("name", "require")}
            values |= {"context": "16k", "batch": o.required}
            for part in m[2].split(", "):
                key, _, value = part.partition(": ")
                values[key] = yaml.safe_load(value)
            spec, _ = load_spec(values["model"])
            fresh = plan_for_spec(spec, options_from_values(values), suggest=False)
            at_low = low_end(fresh, spec).answer.max_requests
            assert at_low == int(m[3]) >= o.required, (result.name, s, at_low)
            assert fresh.kv_range.low.max_requests == at_low  # the range's own low figure, as kvplan size reads it
    assert {"another GPU", "more tensor parallelism", "smallest deployment (kvplan size)"} <= seen, seen


def test_junit_and_annotations_carry_every_suggestion(tmp_path):
    """The same suggestions, all of them, in the table, the JSON, the JUnit XML and the GitHub annotation (the
    annotation used to keep the first 3)."""
    path, report = _conservative(tmp_path)
    assert max(len(o.suggestions) for r in report.results for o in r.outcomes) > 3
    junit = tmp_path / "junit.xml"
    r = runner.invoke(app, ["check", str(path), "--offline", "--conservative", "--junit-xml", str(junit)],
                      env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)})
    assert r.exit_code == 1, r.output
    xml = junit.read_text(encoding="utf-8")
    annotations = [line for line in r.stdout.splitlines() if line.startswith("::error")]
    for result in report.results:
        (note,) = [a for a in annotations if f"title=kvplan check failed%3A {result.name}::" in a]
        for s in result.outcomes[0].suggestions:
            assert s in note, (result.name, s)
            assert s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in xml
    data = json.loads(runner.invoke(app, ["check", str(path), "--offline", "--conservative", "--json"]).stdout)
    assert [c["requirements"][0]["suggestions"] for c in data["checks"]] == [
        list(r.outcomes[0].suggestions) for r in report.results]


def test_junit_times_are_the_real_elapsed_seconds(tmp_path):
    # every testsuite and testcase said time="0": each case carries the seconds its check took (a failing check
    # re-plans its suggestions, so it takes longer than a passing one), the suite at least their sum; a file that
    # cannot be checked carries the seconds it took to find that out
    path = write(tmp_path, """\
        - name: fits
          require: {concurrency: 9}
        - name: too-many
          require: {concurrency: 10}
        """)
    junit = tmp_path / "junit.xml"
    runner.invoke(app, ["check", str(path), "--offline", "--junit-xml", str(junit)])
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    times = {c.get("name"): float(c.get("time")) for c in suite.iter("testcase")}
    assert all(t > 0 for t in times.values()) and times["too-many"] > times["fits"], times
    assert float(suite.get("time")) >= sum(times.values()) - 0.002 and root.get("time") == suite.get("time")  # 3 decimals each
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults: {model: meta-llama/Llama-3.1-8B}\nchecks:\n  - {name: a, require: {concurrency: 0}}\n")
    runner.invoke(app, ["check", str(bad), "--offline", "--junit-xml", str(junit)])
    for element in ET.parse(junit).getroot().iter():
        if "time" in element.attrib:
            assert float(element.get("time")) > 0, element.tag


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp16", "fp8", "int8", "int4"])
def test_a_check_on_a_kv_dtype_the_engine_cannot_run_says_its_verdict_is_a_what_ifs(tmp_path, engine, kv_dtype):
    # estimate prints no launch line for a KV dtype the engine has no --kv-cache-dtype for (vLLM int8 / int4,
    # SGLang fp16 / int8 / int4); a check judged on that plan says so in the text, the JSON and the annotation,
    # and a dtype the engine runs says nothing of the kind
    path = write(tmp_path, f"""\
        - name: dtype
          engine: {engine}
          kv_dtype: {kv_dtype}
          require: {{fits: true}}
        """)
    from kvplan import estimate as api_estimate

    what_if = api_estimate("meta-llama/Llama-3.1-8B", gpu="H100", kv_budget="10GiB", context=8192, engine=engine,
                           kv_dtype=kv_dtype).serve_command is None
    text = " ".join(runner.invoke(app, ["check", str(path), "--offline"]).stdout.split())
    data = json.loads(runner.invoke(app, ["check", str(path), "--offline", "--json"]).stdout)
    env = {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)}
    notes = [line for line in runner.invoke(app, ["check", str(path), "--offline"], env=env).stdout.splitlines()
             if line.startswith("::warning")]
    assert ("the verdict is a what-if's" in text) == what_if, text
    assert (data["checks"][0]["what_if"] is not None) == what_if
    assert bool(notes) == what_if
    if what_if:
        assert f"--kv-dtype {data['checks'][0]['plan']['assumptions']['kv_dtype']}" in data["checks"][0]["what_if"]
        assert "cannot run" in text and "cannot run" in notes[0]
