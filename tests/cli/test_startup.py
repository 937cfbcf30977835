"""Start-up: what ``kvplan estimate`` imports and asks the Hub for (counted, never timed: benchmarks/startup.py
measures wall time in paired runs).

- the command line builds only the command it runs (``kvplan.cli.app.build_app``): ``estimate`` imports no other
  command's module, and a bundled model's ``--json`` imports neither PyYAML nor rich (the shipped YAML files are
  answered from ``kvplan/data/bundled_index.json``, kept current here); its table imports no rich either where
  rich would print it without colour (kvplan.render.styled draws it), and rich's table and panel in colour;
- a first ``--hub`` query asks the Hub three times (config.json's HEAD and GET, the model info's safetensors
  counts), whatever the number of shards; a second one asks nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvplan.io.files import BUNDLED_INDEX, bundled_index_text, parse_bundled_yaml, text_digest
from kvplan.model import hub as kvhub

sys.path.insert(0, str(Path(__file__).parents[1]))
from hub_emulator import HubEmulator, VirtualFile  # noqa: E402
sys.path.insert(0, str(Path(__file__).parents[1] / "model" / "hub"))
from test_hub import REPO, _sharded_repo, _single_file_repo  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "model_specs").rglob("*.yaml")) + [ROOT / "kvplan" / "data" / n for n in ("gpus.yaml", "kv_spread.yaml")]
REGISTRY = "/api/agent-harnesses"  # huggingface_hub's own user-agent registry, fetched at most once a day


def _modules_after(*args: str) -> set[str]:
    code = ("import sys, io, contextlib\nfrom kvplan.cli.app import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        main({list(args)!r})\n    except SystemExit:\n        pass\n"
            "print('\\n'.join(sorted(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_estimate_builds_only_its_command_and_a_bundled_json_reads_no_yaml():
    modules = _modules_after("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--json")
    assert not {m for m in modules if m.startswith("kvplan.cli.commands.")}, modules
    assert "yaml" not in modules and "rich" not in modules and "kvplan.render.estimate" not in modules
    assert "kvplan.checks.compare" not in modules  # only a list of values compares
    assert "kvplan.planning.size" not in modules and "kvplan.io.prices" not in modules  # size's search is its own
    table = _modules_after("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100")
    assert "kvplan.render.estimate" in table and "rich" not in table and "yaml" not in table  # drawn without rich
    assert "kvplan.cli.commands.check" in _modules_after("check", "--help")


def _modules_of_the_entry_point(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """What ``kvplan ARGS`` (the console entry point, as ``python -m kvplan`` runs it) imports beyond what the
    interpreter imports for ``pass`` (a site hook of the machine's own is not the command's); ``env``: variables
    set for the command."""
    code = ("import sys, io, contextlib\nfrom kvplan.cli.entry import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        main({list(args)!r})\n    except SystemExit:\n        pass\n"
            "print('\\n'.join(sorted(sys.modules)))")
    base = subprocess.run([sys.executable, "-c", "import sys; print('\\n'.join(sys.modules))"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0 and base.returncode == 0, r.stderr + base.stderr
    return set(r.stdout.split()) - set(base.stdout.split())


# what `kvplan estimate` on a bundled text model never uses: other stages, other commands, writers, the Hub, the
# command-line framework (a plain line is read without typer), the multimodal profile, and the standard library's
# writers
NOT_USED_BY_ESTIMATE = {
    "torch", "matplotlib", "numpy", "huggingface_hub", "httpx", "requests", "yaml", "pydantic", "prometheus_client",
    "packaging", "typer", "click", "kvplan.sim", "kvplan.explain", "kvplan.observe", "kvplan.paged",
    "kvplan.checks", "kvplan.cli.app", "kvplan.cli.options", "kvplan.cli.commands", "kvplan.model.hub",
    "kvplan.model.quant", "kvplan.io.atomic", "kvplan.io.yamldoc", "kvplan.io.calibration",
    "kvplan.render.report", "kvplan.render.report_cells", "kvplan.render.report_plots", "kvplan.render.check",
    "kvplan.render.compare", "kvplan.render.simulate", "kvplan.render.validate", "kvplan.render.explain",
    "kvplan.render.observe", "kvplan.render.fit", "kvplan.render.catalogue", "kvplan.render.progress",
    "kvplan.planning.auto_length", "kvplan.engines.vllm_profile", "secrets", "tempfile", "subprocess", "shutil", "csv", "html", "xml",
    "http", "urllib.request", "email", "socket", "ssl", "asyncio", "concurrent", "multiprocessing", "difflib",
}


def _used(modules: set[str], forbidden: set[str]) -> set[str]:
    return {m for m in modules if m in forbidden or any(m.startswith(f + ".") for f in forbidden)}


def test_estimate_imports_only_what_it_uses():
    json_run = _modules_of_the_entry_point("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--json")
    assert "kvplan.planning.plan" in json_run  # the run did plan (a failed run would import little)
    assert _used(json_run, NOT_USED_BY_ESTIMATE | {"rich", "kvplan.render.estimate", "kvplan.render.styled",
                                                   "kvplan.planning.suggest"}) == set()
    plain = {"FORCE_COLOR": "", "TTY_COMPATIBLE": "0"}  # rich would write no colour: the table is drawn without it
    table = _modules_of_the_entry_point("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100", env=plain)
    assert "kvplan.render.styled" in table and "kvplan.render.estimate" in table
    # nothing of rich, and the plan fits: nothing suggested
    assert _used(table, NOT_USED_BY_ESTIMATE | {"rich", "kvplan.planning.suggest"}) == set()
    # in colour rich prints it: its table and panel, no emoji codes (rich's ~3,600 names)
    colour = _modules_of_the_entry_point("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100",
                                         env={"FORCE_COLOR": "1", "TTY_COMPATIBLE": ""})
    assert "rich.table" in colour and "rich.panel" in colour
    assert _used(colour, NOT_USED_BY_ESTIMATE | {"rich._emoji_codes", "kvplan.planning.suggest"}) == set()
    # a line the plain path does not read goes to typer: the same command, typer's reading of it
    assert "typer" in _modules_of_the_entry_point("estimate", "meta-llama/Llama-3.1-8B", "--gpu=H100", "--help")


def test_the_bundled_index_holds_every_shipped_yaml_file_as_yaml_reads_it():
    index = json.loads(BUNDLED_INDEX.read_text(encoding="utf-8"))
    texts = [p.read_text(encoding="utf-8") for p in SHIPPED]
    assert BUNDLED_INDEX.read_text(encoding="utf-8") == bundled_index_text(texts), \
        "stale: run python3 benchmarks/gen_bundled_index.py"
    assert len(index) == len(SHIPPED)
    for path, text in zip(SHIPPED, texts):
        assert json.loads(index[text_digest(text)]) == yaml.safe_load(text), path
    # a text the index does not hold is parsed as YAML (an edited spec is never answered from a stale entry)
    edited = texts[0].replace("num_hidden_layers:", "num_hidden_layers:  ", 1)
    assert text_digest(edited) not in index and parse_bundled_yaml(edited, "edited") == yaml.safe_load(edited)


@pytest.mark.parametrize("files", [_single_file_repo, _sharded_repo], ids=["one file", "two shards"])
def test_a_cold_hub_query_asks_three_times_and_a_warm_one_never(hub: HubEmulator, files) -> None:
    commit = hub.add_repo(REPO, files())
    source = kvhub.fetch_model(REPO)
    asked = [(r.method, r.path) for r in hub.requests if r.path != REGISTRY]
    assert asked == [("HEAD", f"/{REPO}/resolve/main/config.json"), ("GET", f"/{REPO}/resolve/main/config.json"),
                     ("GET", f"/api/models/{REPO}/revision/{commit}")]
    assert source.weights is not None and source.weights.parameters in (321_792, 453_164)
    seen = len(hub.requests)
    again = kvhub.fetch_model(REPO)
    assert len(hub.requests) == seen  # kvplan's summary of the counts answers, equal to the online answer
    assert (again.weights.parameters, again.weights.total_bytes, dict(again.weights.params_by_dtype)) == \
        (source.weights.parameters, source.weights.total_bytes, dict(source.weights.params_by_dtype))


def test_the_cli_asks_the_hub_three_times_cold_and_not_at_all_warm(tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "model_specs" / "meta-llama" / "Llama-3.1-8B.yaml").read_text(encoding="utf-8"))
    files = {"config.json": spec["config"],
             "model.safetensors": VirtualFile.safetensors({"w": ("BF16", [spec["weights"]["parameters"]])})}
    with HubEmulator() as hub:
        hub.add_repo("acme/Llama-3.1-8B", files)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(HF_HOME=str(tmp_path), HF_ENDPOINT=hub.url)
        cmd = [sys.executable, "-m", "kvplan", "estimate", "acme/Llama-3.1-8B", "--hub", "--gpu", "H100", "--json"]
        for _ in range(2):
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
            assert r.returncode == 0, r.stderr
        paths = [r.path for r in hub.requests]
    assert paths.count(REGISTRY) <= 1  # huggingface_hub's, kept in HF_HOME for a day
    assert len([p for p in paths if p != REGISTRY]) == 3, paths  # the second run asked nothing
    assert json.loads(r.stdout)["per_token"]["kv_bytes_per_token_gpu"] == 131_072
