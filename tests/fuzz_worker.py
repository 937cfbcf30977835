"""Fuzz worker for tests/e2e/test_fuzz.py: feeds generated files and option values to the real CLI entry point.

Run as ``python tests/fuzz_worker.py MODE EXAMPLES`` in a fresh interpreter (the test measures its memory
and wall time from outside). For every input, ``kvplan.cli.app.main`` must end in ``SystemExit`` with 0, 1
or 2; exit 2 must print only ``kvplan: error: ...`` lines; nothing may raise anything else (a traceback)
or run past :data:`DEADLINE_S` (a SIGALRM turns a hang into a failure that names the input).

Modes: ``config`` (config.json bytes: random bytes, JSON-shaped values, mutated real configs),
``yaml`` (capacity / what-if / workload files: random bytes, mutated examples), ``options`` (estimate,
simulate and observe option values: numbers, non-finite spellings, units, garbage; observe's URLs).

``observe`` polls a refused loopback port (no DNS, no waiting) and its loop's sleep is replaced by one that
returns at once and presses Ctrl-C after 3 s asked for, so a run ends as a user's Ctrl-C ends it; a number
outside observe's documented bounds must be refused (exit 2) before any poll.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 10.0
sys.path.insert(0, str(ROOT))

from entry_point import build_each_app_once  # noqa: E402  (tests/, this script's folder)

FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "configs" / "mistral_v01.json").read_text())
EXAMPLES = {name: (ROOT / "docs" / "examples" / name).read_text() for name in ("capacity.yaml", "whatif.yaml", "no_sharing.yaml")}
# the what-if example without its HTML / Markdown outputs (their plots would make each example slow)
EXAMPLES["whatif.yaml"] = EXAMPLES["whatif.yaml"].replace("  - whatif-report/report.html\n", "").replace(
    "  - whatif-report/report.md\n", "")

# values people (and fuzzers) type: numbers of every size and spelling, non-finite, units, garbage
NUMBERISH = st.one_of(
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e308", "1e999", "-0", "0", "0.0", "1e-320", "8k", "128k", "1m",
                     "24GiB", "80GB", "1e30", "99999999999999999999999", "0x10", "1_000", "80,464", " 7 ", "", "--",
                     "auto", "-1", "3.5", "2**10", "\u0661", "1e30GiB", "-24GiB", "9" * 5000]),
    st.text(max_size=12),
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-10**40, 10**40) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


def fuzz_settings(examples: int) -> settings:
    """Reproducible runs (the seed comes from the test's source), no example database, and no ``explain``
    phase: its line tracer slows a failing input's re-runs several-fold, so a slow input would be reported
    as a second, misleading hang."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), phases=[p for p in Phase if p is not Phase.explain])


class Hang(Exception):
    pass


CODES: dict[int, int] = {}  # exit code -> how many inputs ended with it (printed at the end)


def _alarm(signum, frame):  # noqa: ANN001, ARG001
    raise Hang(f"still running after {DEADLINE_S:g} s")


def run_cli(args: list[str], cwd: Path, event_lines: bool = False, stdout: list[str] | None = None) -> tuple[int, str]:
    """One CLI invocation: must exit 0/1/2, exit 2 with only one-line errors (``event_lines``: observe's
    ``kvplan: [t s] ...`` lines may come first), within the deadline; returns the exit code and stderr
    (and appends stdout to ``stdout`` when given)."""
    from kvplan.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    signal.setitimer(signal.ITIMER_REAL, DEADLINE_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # a traceback (or a hang): the input that caused it is the failure
        raise AssertionError(f"kvplan {args!r} raised:\n{traceback.format_exc()}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(old)
    CODES[code] = CODES.get(code, 0) + 1
    if stdout is not None:
        stdout.append(out.getvalue())
    assert code in (0, 1, 2), f"kvplan {args!r} exited {code}: {err.getvalue()[-500:]}"
    if code == 2:
        lines = err.getvalue().strip().splitlines()
        errors = lines[-1:] if event_lines else lines
        assert lines and all(line.startswith("kvplan: error: ") for line in errors), \
            f"kvplan {args!r}: exit 2 without one-line errors:\n{err.getvalue()[-800:]}"
        assert all(line.startswith("kvplan: ") for line in lines), f"kvplan {args!r}:\n{err.getvalue()[-800:]}"
    return code, err.getvalue()


def _mutated_config(data: st.DataObject) -> bytes:
    config = dict(FIXTURE)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(config) + ["text_config", "layer_types", "head_dim", "num_experts"]))
        config[key] = data.draw(JSONISH)
    return json.dumps(config, allow_nan=True).encode()


# the fixture's sizing fields and the kvplan.limits bound each is read under: inputs at and near the bounds
# are where an accepted value can still make an absurd plan (a 2**32-position rotary table: 1,024 GiB)
BOUNDED_KEYS = {"num_hidden_layers": "num_layers", "max_position_embeddings": "max_position_embeddings",
                "sliding_window": "sliding_window", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
                "head_dim": "head_dim", "num_attention_heads": "num_attention_heads", "num_key_value_heads": "kv_heads",
                "vocab_size": "vocab_size", "num_local_experts": "num_experts"}


def _near_bound_config(data: st.DataObject) -> bytes:
    from kvplan.limits import CONFIG_MAXIMA, MAX_CONFIG_INT

    config = dict(FIXTURE)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(BOUNDED_KEYS)))
        bound = CONFIG_MAXIMA.get(BOUNDED_KEYS[key], MAX_CONFIG_INT)
        config[key] = data.draw(st.sampled_from([bound, bound - 1, bound + 1, bound // 2, 0, -1])
                                | st.integers(0, 48).map(lambda k: 1 << k))
    if data.draw(st.booleans()):
        config["rope_scaling"] = {"rope_type": data.draw(st.sampled_from(["linear", "yarn", "dynamic", "longrope"])),
                                  "factor": data.draw(st.sampled_from([2.0, 1e3, 1e6, 1e300])),
                                  "original_max_position_embeddings": data.draw(st.integers(0, 1 << 40))}
    return json.dumps(config).encode()


def _check_plan_terms(text: str) -> None:
    """A plan kvplan prints must be bounded: every budget term within 1 PiB, the fixed overhead within the GPU."""
    from kvplan.limits import MAX_SIZE_BYTES

    budget = json.loads(text)["budget"]
    terms = {k: v for k, v in budget.items() if k.endswith("_bytes") and isinstance(v, (int, float))}
    assert all(abs(v) <= MAX_SIZE_BYTES for v in terms.values()), f"a term past 1 PiB: {terms}"
    assert budget["overhead_bytes"] <= budget["total_bytes"], f"overhead past the GPU: {terms}"


def fuzz_config(examples: int) -> None:
    @fuzz_settings(examples)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["bytes", "json", "mutated", "deep", "bounds"]))
        if kind == "bounds":
            raw = _near_bound_config(data)
        elif kind == "bytes":
            raw = data.draw(st.binary(max_size=400))
        elif kind == "json":
            raw = json.dumps(data.draw(JSONISH), allow_nan=True).encode()
        elif kind == "deep":
            depth = data.draw(st.integers(50, 50_000))
            raw = (b'{"a": ' * depth) + b"1" + (b"}" * depth)
        else:
            raw = _mutated_config(data)
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "config.json").write_bytes(raw)
            json_out = data.draw(st.booleans())
            out: list[str] = []
            code, _ = run_cli(["estimate", str(Path(d) / "config.json"), "--gpu", "H100", "--offline",
                               *(["--json"] if json_out else [])], Path(d), stdout=out)
            if json_out and code == 0:
                _check_plan_terms(out[0])

    check()


@functools.lru_cache(maxsize=None)
def _example_doc(text: str) -> Any:
    """An example file's YAML, parsed once (each input mutates a deep copy)."""
    import yaml

    return yaml.safe_load(text)


def _mutated_yaml(data: st.DataObject, text: str) -> str:
    import yaml

    doc = copy.deepcopy(_example_doc(text))
    for _ in range(data.draw(st.integers(1, 3))):
        target = doc
        path = []
        while isinstance(target, (dict, list)) and target and data.draw(st.booleans()):
            key = data.draw(st.sampled_from(sorted(target, key=str) if isinstance(target, dict) else range(len(target))))
            path.append(key)
            if not isinstance(target[key], (dict, list)):
                break
            target = target[key]
        value = data.draw(st.one_of(JSONISH, NUMBERISH))
        if isinstance(target, dict) and target:
            target[data.draw(st.sampled_from(sorted(target, key=str)))] = value
        elif isinstance(target, list) and target:
            target[data.draw(st.integers(0, len(target) - 1))] = value
    return yaml.safe_dump(doc, allow_unicode=True)


def fuzz_yaml(examples: int) -> None:
    @fuzz_settings(examples)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(EXAMPLES)))
        kind = data.draw(st.sampled_from(["bytes", "mutated", "mutated", "mutated"]))
        text = EXAMPLES[name]
        raw = data.draw(st.binary(max_size=300)) if kind == "bytes" else _mutated_yaml(data, text).encode()
        command = {"capacity.yaml": ["check"], "whatif.yaml": ["report"], "no_sharing.yaml": ["simulate"]}[name]
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / name
            path.write_bytes(raw)
            extra = ["--offline"]
            if name == "no_sharing.yaml":  # a short run: the file's own traffic volume is the work bound's job
                extra += ["--duration", "2"]
            run_cli([*command, str(path), *extra], Path(d))

    check()


ESTIMATE_OPTIONS = ["--gpu", "--gpu-memory", "--gpus", "--tp", "--pp", "--context", "--batch", "--max-model-len",
                    "--prefix-tokens", "--engine", "--engine-version", "--dtype", "--kv-dtype", "--weights-dtype",
                    "--weights-gib", "--gpu-util", "--kv-budget", "--activation-gib", "--overhead-gib",
                    "--cudagraph-gib", "--block-size", "--max-num-batched-tokens", "--max-num-seqs", "--layers",
                    "--kv-heads", "--head-dim", "--usage-context", "--quantization", "--ssm-dtype", "--images"]


def _a_port(text: str) -> bool:
    try:
        return 2 <= int(text) <= 65535
    except ValueError:
        return False


OBSERVE_URLS = st.one_of(
    st.sampled_from(["127.0.0.1:1", "http://127.0.0.1:1/metrics", "http://[::1", "http://[::1]:1/metrics",
                     "http://user:pw@[::1/metrics", "http://[zz]:1", "http://127.0.0.1:1:2/", "http://a..b:1/",
                     "http://127.0.0.1:99999/", "ftp://127.0.0.1:1/", "", "http://", "http://:1/",
                     "http://127.0.0.1:1/m\u00e9trics", "http://127.0.0.1:1/?q=\u00fc", "127.0.0.1:1\n",
                     "http://127.0.0.1:1/%zz"]),
    st.text(max_size=12).map(lambda t: "http://127.0.0.1:1/" + t),  # the host stays a refused loopback port
    NUMBERISH.filter(lambda n: not _a_port(n)).map(lambda n: "127.0.0.1:" + n),  # never a port that may listen
)
OBSERVE_NUMBERS = {"--interval": "INTERVAL_S", "--duration": "DURATION_S", "--timeout": "TIMEOUT_S"}


class CtrlCSleep:
    """observe's loop sleep in the fuzz: returns at once, and is Ctrl-C once 3 s were asked for in all."""

    def __init__(self) -> None:
        self.asked = 0.0

    def __call__(self, seconds: float) -> None:
        self.asked += seconds
        if self.asked > 3.0:
            raise KeyboardInterrupt


def _out_of_bounds(flag: str, text: str) -> bool:
    """Whether observe must refuse ``flag text``: a number click reads (float()) outside the documented bounds."""
    from kvplan.observe import session

    try:
        value = float(text)
    except ValueError:
        return False  # click's own usage error (exit 2 too)
    low, high = getattr(session, OBSERVE_NUMBERS[flag])
    too_low = value <= low if flag == "--duration" else value < low
    return not (value == value and abs(value) != float("inf")) or too_low or value > high


def fuzz_observe(data: st.DataObject, d: Path) -> None:
    from kvplan.observe import session

    session.run.__kwdefaults__["sleep"] = CtrlCSleep()
    args = ["observe", data.draw(OBSERVE_URLS)]
    numbers = {flag: data.draw(NUMBERISH) for flag in data.draw(st.lists(st.sampled_from(sorted(OBSERVE_NUMBERS)),
                                                                          min_size=1, max_size=3, unique=True))}
    for flag, text in numbers.items():
        args += [flag, text]
    if data.draw(st.booleans()):
        args.append("--json")
    code, err = run_cli(args, d, event_lines=True)
    if any(_out_of_bounds(flag, text) for flag, text in numbers.items()):
        assert code == 2 and "kvplan: [" not in err, f"kvplan {args!r}: a number out of bounds was used:\n{err[-800:]}"


def fuzz_options(examples: int) -> None:
    workload = ("model: meta-llama/Llama-3.1-8B\nkv_budget: 2GiB\nmax_model_len: 4096\narrivals: {rate: 5}\n"
                "num_requests: 40\nprompt_tokens: 100\noutput_tokens: 50\n")

    @fuzz_settings(examples)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        with tempfile.TemporaryDirectory() as d:
            command = data.draw(st.sampled_from(["simulate", "estimate", "estimate", "estimate", "observe"]))
            if command == "observe":
                fuzz_observe(data, Path(d))
                return
            if command == "simulate":
                (Path(d) / "w.yaml").write_text(workload)
                args = ["simulate", "w.yaml", "--policy", "paged"]
                for flag in data.draw(st.lists(st.sampled_from(["--duration", "--seed"]), min_size=1, max_size=2,
                                               unique=True)):
                    args += [flag, data.draw(NUMBERISH)]
            else:
                args = ["estimate", data.draw(st.sampled_from(["meta-llama/Llama-3.1-8B", "google/gemma-2-9b-it",
                                                               "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-Next-80B-A3B-Instruct"]))]
                for flag in data.draw(st.lists(st.sampled_from(ESTIMATE_OPTIONS), min_size=1, max_size=3, unique=True)):
                    args += [flag, data.draw(NUMBERISH)]
                args.append("--offline")
            run_cli(args, Path(d))

    check()


def main() -> None:
    signal.signal(signal.SIGALRM, _alarm)
    build_each_app_once()  # as tests/conftest.py does for the suite
    mode, examples = sys.argv[1], int(sys.argv[2])
    {"config": fuzz_config, "yaml": fuzz_yaml, "options": fuzz_options}[mode](examples)
    print("ok", json.dumps(CODES, sort_keys=True))


if __name__ == "__main__":
    main()
