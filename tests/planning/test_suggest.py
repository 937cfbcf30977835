"""Every printed suggestion is the change it was planned with, passes the options' own validation and fits
(issue 12: suggestions wrong for the deployment).

Before: Llama-3.2-Vision on a vLLM release that dropped mllama got "try a bigger GPU" (no GPU helps);
``kvplan check`` offered "require concurrency <= 0"; gpt2 with ``--prefix-tokens 2k`` got ``--context 1024``,
which the options then reject (prefix past the context); ``--max-model-len auto`` with ``--kv-dtype fp8``
hinted "use --kv-dtype fp8". A suggestion is now a set of option changes validated like user input
(:func:`kvplan.planning.suggest.revise`), re-planned, and printed from the difference (:func:`kvplan.planning.suggest.spell`).
"""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from kvplan.checks.capacity import run_checks
from kvplan.errors import InputError
from kvplan.options import OPTIONS
from kvplan.planning.plan import options_from_values, plan_for_spec
from kvplan.checks.scenario import load_capacity
from kvplan.model.sources import bundled_ids, load_bundled, load_spec
from kvplan.model.spec import build_spec

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))
from test_cross_attention import LLAMA_32_90B_VISION  # noqa: E402
from entry_point import assert_one_line, kvplan  # noqa: E402
from source_trees import nodes  # noqa: E402

# the CLI spelling of each option -> (its name, the value a bare flag means)
FLAGS: dict[str, tuple[str, object]] = {}
for _opt in OPTIONS:
    for _spelling in _opt.cli_flags:
        on, _, off = _spelling.partition("/")
        FLAGS[on] = (_opt.name, True)
        if off:
            FLAGS[off] = (_opt.name, False)


def apply_flags(values: dict, suggestion: str) -> dict:
    """``values`` with one suggestion's flags applied as a user pasting them would (``--context 1024
    --prefix-tokens 1024``); ``without --gpu-memory`` drops the option."""
    out = dict(values)
    words = suggestion.split()
    i = 0
    while i < len(words):
        if words[i] == "without":
            out.pop(FLAGS[words[i + 1]][0], None)
            i += 2
            continue
        name, bare = FLAGS[words[i]]
        if i + 1 < len(words) and not words[i + 1].startswith("-") and words[i + 1] != "without":
            out[name] = words[i + 1]
            i += 2
        else:
            out[name] = bare
            i += 1
    return out


@lru_cache(maxsize=None)
def spec_of(model_id: str):  # noqa: ANN201
    return build_spec(load_bundled(model_id))


# what a serving engineer asks for that does not fit: a prefix on a small GPU, a context past the model's
# maximum, a fixed max_model_len, SGLang, and --gpus alone (tp follows it)
SCENARIOS = (
    {"gpu": "L4", "context": "32k", "batch": 64, "prefix_tokens": "2k"},
    {"gpu": "H100", "context": "200k", "batch": 3},
    {"gpu": "H100", "context": "64k", "max_model_len": "64k", "batch": 40},
    {"gpu": "A100-40GB", "context": "16k", "batch": 128, "engine": "sglang"},
    {"gpu": "L4", "gpus": 2, "context": "32k", "batch": 64},
)


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
def test_every_estimate_suggestion_pasted_parses_and_fits(values):
    tried = 0
    for model_id in bundled_ids():
        spec = spec_of(model_id)
        given = {"model": model_id, "offline": True, **values}
        try:
            p = plan_for_spec(spec, options_from_values(given))
        except InputError:
            continue
        assert p.answer.fits or p.answer.fix is None or p.answer.fix.startswith("--"), (model_id, p.answer.fix)
        for one in (p.answer.fix or "").split(" or ") if not p.answer.fits else ():
            if not one:
                continue
            assert not re.search(r"\d,\d", one), one  # no thousands separators: the options reject them
            pasted = options_from_values(apply_flags(given, one))  # the user's own validation
            assert plan_for_spec(spec, pasted, suggest=False).answer.fits, (model_id, values, one)
            tried += 1
    assert tried >= 10  # the scenarios do exercise suggestions


@pytest.mark.parametrize("size,spelled", [(24 << 30, "24GiB"), (1536 << 20, "1536MiB"), (3 << 40, "3TiB"),
                                          (1000, "1000B"), ((8 << 30) + 1, "8589934593B")])
def test_a_suggested_size_is_spelled_in_a_unit_a_person_reads_and_the_option_takes_back(size, spelled):
    from kvplan.planning.suggest import spell_value

    assert spell_value("kv_budget_bytes", size) == spelled  # was "25769803776B" for 24 GiB
    assert options_from_values({"model": "x", "kv_budget": spelled}).kv_budget_bytes == size


def test_a_context_suggestion_takes_the_prefix_down_with_it():
    # gpt2 (1,024 positions) at 2k with a 2k shared prefix: "--context 1024" alone is rejected
    # ("--prefix-tokens 2048 exceeds --context 1024"); the suggestion names both
    p = plan_for_spec(spec_of("openai-community/gpt2"),
                      options_from_values({"model": "openai-community/gpt2", "context": "2k", "prefix_tokens": "2k"}))
    assert p.answer.fix == "--context 1024 --prefix-tokens 1024"
    with pytest.raises(InputError, match="exceeds --context"):
        options_from_values({"model": "openai-community/gpt2", "context": "1024", "prefix_tokens": "2k"})


def test_a_release_that_dropped_the_architecture_gets_releases_that_serve_it(tmp_path):
    # Llama-3.2-90B-Vision on vLLM 0.29 (mllama dropped in 0.11): before "try a bigger GPU (no single change of
    # batch, context, KV dtype or tp fits)"; no GPU helps, the last release that serves it and SGLang do
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_32_90B_VISION))
    values = {"model": str(tmp_path), "gpu": "H200", "tp": 4, "weights_gib": 177}
    p = plan_for_spec(load_spec(str(tmp_path))[0], options_from_values(values))
    assert "do not serve MllamaForConditionalGeneration" in p.answer.refusal
    assert "vllm 0.10.2 and earlier or --engine sglang serve it" in p.answer.refusal
    assert p.answer.fix == "--engine-version 0.10.2 or --engine sglang"
    for one in p.answer.fix.split(" or "):
        assert plan_for_spec(p.spec, options_from_values(apply_flags(values, one))).answer.fits, one
    text = " ".join(kvplan("estimate", str(tmp_path), "--gpu", "H200", "--tp", "4", "--weights-gib", "177").stdout.split())
    assert "bigger GPU" not in text


def test_nothing_is_suggested_when_no_single_change_fits():
    # Llama-3.1-70B x 64 requests of 128k on an RTX 4090: no batch, context, fp8, tp x8 or larger GPU alone fits;
    # before "a bigger GPU", which no GPU in the catalogue is
    p = plan_for_spec(spec_of("meta-llama/Llama-3.1-70B"),
                      options_from_values({"model": "meta-llama/Llama-3.1-70B", "gpu": "rtx4090", "context": "128k",
                                           "batch": 64}))
    assert p.answer.fix is None
    text = " ".join(kvplan("estimate", "meta-llama/Llama-3.1-70B", "-g", "rtx4090", "-c", "128k", "-b", "64")
                    .stdout.replace("│", " ").split())
    assert "no single change of batch, context, max_model_len, max_num_seqs, KV dtype, tp, engine or GPU fits" in text
    assert "bigger GPU" not in text


def test_the_auto_hint_is_replanned_and_never_repeats_a_setting():
    # Mixtral-8x7B's 87 GiB of weights on one H100 with fp8 KV already set: before "use --kv-dtype fp8"
    line = assert_one_line(kvplan("estimate", "mistralai/Mixtral-8x7B-v0.1", "-g", "H100", "--kv-dtype", "fp8",
                                  "--max-model-len", "auto"), "--max-model-len auto: the engine starts with no")
    assert "fp8" not in line.split("(try ")[1] and "(try --tp 2)" in line
    assert kvplan("estimate", "mistralai/Mixtral-8x7B-v0.1", "-g", "H100", "--kv-dtype", "fp8",
                  "--max-model-len", "auto", "--tp", "2").returncode == 0


def _check(tmp_path: Path, checks: str):
    path = tmp_path / "capacity.yaml"
    path.write_text("defaults: {gpu: H100}\nchecks:\n" + checks, encoding="utf-8")
    return run_checks(load_capacity(path), offline=True).results


def test_check_never_asks_for_a_requirement_of_nothing(tmp_path):
    # Llama-3.1-70B on an RTX 4090: no request fits, so "require concurrency <= 0" (and context <= 0) checks nothing
    (conc, ctx) = _check(tmp_path, "  - {name: c, model: meta-llama/Llama-3.1-70B, gpu: rtx4090,"
                                   " require: {concurrency: 1}}\n"
                                   "  - {name: x, model: meta-llama/Llama-3.1-70B, gpu: rtx4090,"
                                   " require: {context: 1024}}\n")
    for result in (conc, ctx):
        assert result.plan.answer.max_requests == 0
        text = "\n".join(result.outcomes[0].suggestions)
        assert "<= 0" not in text and "more tensor parallelism: tp: 8" in text, text


CHECKS = """\
  - {name: conc, model: meta-llama/Llama-3.1-8B, context: 32k, prefix_tokens: 2k, require: {concurrency: 40}}
  - {name: head, model: Qwen/Qwen3-8B, context: 16k, batch: 30, require: {headroom_pct: 20}}
  - {name: start, model: openai-community/gpt2, context: 2k, prefix_tokens: 2k, require: {engine_starts: true}}
  - {name: ctx, model: mistralai/Mistral-7B-v0.1, gpu: L4, batch: 8, require: {context: 32768}}
  - {name: gpus, model: meta-llama/Llama-3.1-70B, gpu: L40S, gpus: 2, context: 16k, require: {concurrency: 16}}
"""


def test_every_check_suggestion_applied_to_the_file_passes(tmp_path):
    """Each "to pass" line that changes the check's options, written back into the check, makes it pass."""
    import yaml

    applied = 0
    for result in _check(tmp_path, CHECKS):
        assert not result.passed, result.name
        check = next(c for c in yaml.safe_load(CHECKS) if c["name"] == result.name)
        for outcome in result.outcomes:
            for s in outcome.suggestions:
                if s.startswith("require "):
                    assert int(s.split("<= ")[1].split(" ")[0]) >= 1, s
                    continue
                replicas = re.fullmatch(r"replicas \(kvplan size\): (\d+) x \{(.+)\} = \d+ GPUs "
                                        r"\(concurrency \d+ x (\d+) requests\)", s)
                target = check
                if replicas:  # data parallel: one replica of that shape passes its share, the replicas all of it
                    count, shape, per = int(replicas[1]), replicas[2], int(replicas[3])
                    assert count * per >= check["require"]["concurrency"] > (count - 1) * per, s
                    s = f"one replica: {shape} (concurrency {per} requests)"
                    target = {k: v for k, v in check.items() if k != "gpus"} | {"require": {"concurrency": per}}
                changes, after = s.split(": ", 1)[1].rsplit(" (", 1)
                # the changed values and what they were, as the file's keys accept them (what they give: 32,768 tokens)
                assert not re.search(r"\d,\d", changes), s
                assert not (after.startswith("was ") and re.search(r"\d,\d", after)), s
                fixed = {k: v for k, v in target.items() if k != "name"}
                for part in changes.split(", "):
                    key, _, value = part.partition(": ")
                    if key.startswith("without "):
                        fixed.pop(key.removeprefix("without "), None)
                    else:
                        fixed[key] = yaml.safe_load(value)
                fixed["name"] = check["name"]
                sub = tmp_path / "one"
                sub.mkdir(exist_ok=True)
                (again,) = _check(sub, "  - " + json.dumps(fixed) + "\n")
                assert again.passed, (result.name, s, [o.message for o in again.outcomes])
                applied += 1
    assert applied >= 8


# ---------------------------------------------------------------------------------------------
# wording: counts in the right number, values as the options accept them, no tracker numbers, the engine used


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_short_by_one_block_is_singular(tmp_path):
    # Llama-3.1-8B, 10 GiB of KV = 5,120 blocks of 2 MiB (one null): ten 8k requests need 10 x 512 = 5,120 > 5,119,
    # short by 1 block (before: "short by 1 blocks")
    args = ("meta-llama/Llama-3.1-8B", "-g", "H100", "--kv-budget", "10GiB", "-c", "8k", "-b", "10")
    assert "does NOT fit (short by 1 block = 2 MiB; 1 null block kept by vllm)" in _flat(kvplan("estimate", *args).stdout)
    path = tmp_path / "c.yaml"
    path.write_text("defaults: {model: meta-llama/Llama-3.1-8B, gpu: H100, kv_budget: 10GiB, context: 8k}\n"
                    "checks:\n  - {name: ten, batch: 10, require: {fits: true}}\n", encoding="utf-8")
    (r,) = run_checks(load_capacity(path), offline=True).results
    assert "(short by 1 block = 16 token slots; 1 null block kept by vllm)" in r.outcomes[0].message


# f-string values before a plural noun that are not counts in kvplan's own words: layer kinds ("sliding layers"),
# vLLM's verbatim log line ("KV cache size: N tokens; ... for N tokens per request"), a float peak, an assert
NOT_COUNTS = {"cache.kind.value", "value", "other[0]", "state_kind", "launch.kv_tokens", "launch.max_model_len",
              "s.running_peak", "len(cached)"}


def test_no_user_facing_string_has_a_count_before_a_plural_noun_unchecked():
    """Every f-string that puts a number in front of blocks/requests/tokens/layers/rows/GPUs/checks goes through
    ``plural`` (``1 block``, ``2 blocks``); the exceptions are vLLM's own log line and nouns after a word."""
    import ast

    root = Path(__file__).resolve().parents[2] / "kvplan"
    bad = []
    pattern = re.compile(r"^(blocks|requests|tokens|layers|rows|GPUs|checks)\b")
    for path in root.rglob("*.py"):
        for node in nodes(path):
            if not isinstance(node, ast.JoinedStr):
                continue
            parts = node.values
            for value, after in zip(parts, parts[1:]):
                if (isinstance(value, ast.FormattedValue) and isinstance(after, ast.Constant)
                        and isinstance(after.value, str) and pattern.match(after.value.removeprefix(" "))
                        and after.value.startswith(" ")):
                    text = ast.unparse(value.value)
                    rate = after.value.split()[0].endswith("/") or "/" in after.value.split()[0]  # tokens/s
                    signed = value.format_spec is not None and "+" in ast.unparse(value.format_spec)
                    if rate or signed or text in NOT_COUNTS or text.startswith("_count("):
                        continue
                    bad.append(f"{path.relative_to(root)}:{node.lineno}: {{{text}}}{after.value[:12]}")
    assert bad == []


def test_errors_echo_values_the_options_accept():
    # before: "--context 32,768 exceeds --max-model-len 8,192" (the options reject "8,192")
    line = assert_one_line(kvplan("estimate", "meta-llama/Llama-3.1-8B", "-c", "32k", "--max-model-len", "8k"))
    assert "--context 32768 exceeds --max-model-len 8192" in line and not re.search(r"\d,\d", line)
    line = assert_one_line(kvplan("estimate", "openai-community/gpt2", "-c", "1k", "--prefix-tokens", "2k"))
    assert "--prefix-tokens 2048 exceeds --context 1024" in line


def test_no_tracker_numbers_in_user_facing_strings():
    """"issue 15" means nothing to a user: no string literal in kvplan/ (comments and docstrings aside) names one."""
    import ast

    root = Path(__file__).resolve().parents[2] / "kvplan"
    bad = []
    for path in root.rglob("*.py"):
        docstrings = {id(n.body[0].value) for n in nodes(path)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in nodes(path):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and re.search(r"\bissue #?\d+", node.value, re.I)):
                bad.append(f"{path.relative_to(root)}:{node.lineno}: {node.value[:60]}")
    assert bad == []


def test_the_tp_error_names_the_engine_used():
    # Llama-3.1-8B has 32 attention heads: tp 3 divides nothing; SGLang refuses it too (before: "(vLLM requires it)")
    line = assert_one_line(kvplan("estimate", "meta-llama/Llama-3.1-8B", "--tp", "3", "--engine", "sglang"))
    assert "does not divide the model's 32 attention heads (sglang requires it)" in line and "vLLM" not in line
    assert "(vllm requires it)" in assert_one_line(kvplan("estimate", "meta-llama/Llama-3.1-8B", "--tp", "3"))


def test_check_on_a_release_that_dropped_the_architecture(tmp_path):
    # a refused start says why, and no "longest max_model_len that starts is 0" nor "short by -N blocks";
    # the suggestions are the release that serves it and SGLang, each re-planned
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "config.json").write_text(json.dumps(LLAMA_32_90B_VISION))
    model = str(tmp_path / "vision")
    starts, fits = _check(tmp_path, f"  - {{name: s, model: {model}, gpu: H200, tp: 4, weights_gib: 177,"
                                    " require: {engine_starts: true}}\n"
                                    f"  - {{name: f, model: {model}, gpu: H200, tp: 4, weights_gib: 177,"
                                    " require: {fits: true}}\n")
    for result in (starts, fits):
        o = result.outcomes[0]
        assert "do not serve MllamaForConditionalGeneration" in o.message
        assert "starts is 0" not in o.message and "short by" not in o.message, o.message
        assert o.suggestions == (f"a release that serves the model: engine_version: 0.10.2 ({o.requirement} yes)",
                                 f"another engine: engine: sglang ({o.requirement} yes)")


def test_the_serve_line_offers_a_max_model_len_flag_only_when_the_options_accept_it():
    # gpt2 at 2k: "it starts with --max-model-len 1024" is rejected with --context 2k (context past max_model_len)
    text = _flat(kvplan("estimate", "openai-community/gpt2", "-c", "2k").stdout)
    assert "serve: none for max_model_len 2,048; the longest max_model_len it starts with is 1,024" in text
    assert "--max-model-len 1024" not in text
    # an explicit max_model_len past the pool, at a context that fits: the flag is one the options accept
    text = _flat(kvplan("estimate", "meta-llama/Llama-3.1-8B", "-g", "H100", "--kv-budget", "10GiB", "-c", "8k",
                        "--max-model-len", "128k").stdout)
    assert "it starts with --max-model-len 81904" in text  # 5,119 usable blocks x 16 tokens
    assert kvplan("estimate", "meta-llama/Llama-3.1-8B", "-g", "H100", "--kv-budget", "10GiB", "-c", "8k",
                  "--max-model-len", "81904").returncode == 0


def test_validate_with_no_pool_gives_the_replanned_suggestion():
    # 70B weights (131 GiB) on a 24 GB card: nothing to validate; the hint is estimate's re-planned change
    # (before: the bare flags "--tp 8", or "--kv-budget, --gpu-util", which do not help when the weights do not fit)
    args = ("validate", "meta-llama/Llama-3.1-70B", "--gpu", "rtx4090", "--device", "cpu")
    assert_one_line(kvplan(*args), "the plan leaves 0 KV blocks on this GPU", "(try --tp 8)")
    line = assert_one_line(kvplan(*args, "-c", "128k", "-b", "64"), "no single change of batch, context")
    assert "--kv-budget" not in line
