"""Packaging and start-up: the wheel ships model_specs; the CLI imports no heavy module."""

import json
import os
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import kvplan

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "matplotlib", "huggingface_hub", "pydantic_settings")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_cli_import_is_light():
    code = "import sys, kvplan.cli.app; print([m for m in {!r} if m in sys.modules])".format(HEAVY)
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_estimate_imports_no_torch_or_matplotlib():
    code = (
        "import sys\n"
        "from kvplan.cli.app import main\n"
        "sys.argv = ['kvplan', 'estimate', 'meta-llama/Llama-3.1-8B', '--gpu', 'H100', '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write(repr([m for m in {!r} if m in sys.modules]))\n".format(HEAVY)
    )
    r = _python(code)
    assert json.loads(r.stdout)["per_token"]["kv_bytes_per_token_gpu"] == 131_072
    assert r.stderr.strip() == "[]"


def test_python_dash_m_works():
    r = subprocess.run([sys.executable, "-m", "kvplan", "--version"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and r.stdout.startswith("kvplan ")


# One fresh interpreter that imports nothing of kvplan forks a child per module: each child starts from that
# interpreter's state, as a fresh one would (an interpreter's start-up is paid once instead of 140 times); without
# fork (not POSIX), a process per module. The parent first imports the third-party modules kvplan's modules import
# at module level (torch, pydantic, typer, PyYAML, rich's parts) and freezes them out of the collector, so no child
# imports them again (torch alone took 1.1 s of CPU in each of 2 children, pydantic 0.1 s in each of ~15) or copies
# their pages when its collector walks them. What a child imports is kvplan's own, in the order the module asks for
# it: what this test is about (an import cycle, a module that works only when another was imported first).
THIRD_PARTY = ("torch", "pydantic", "typer", "yaml", "rich.console", "rich.table", "rich.panel", "rich.text")
_IMPORT_EACH = """
import gc, importlib, json, os, sys, traceback
for name in THIRD_PARTY:
    importlib.import_module(name)
assert not [m for m in sys.modules if m.partition(".")[0] == "kvplan"]
gc.freeze()
failed = {}
for name in sys.argv[1:]:
    if not hasattr(os, "fork"):
        import subprocess
        r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True)
        if r.returncode:
            failed[name] = r.stderr[-500:]
        continue
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc()[-500:].encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        err = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status:
        failed[name] = err or f"exit status {status}"
print(json.dumps(failed))
""".replace("THIRD_PARTY", repr(THIRD_PARTY))


def test_every_module_imports_in_a_fresh_interpreter():
    names = [m.name for m in pkgutil.walk_packages(kvplan.__path__, "kvplan.")]
    assert "kvplan.memory" in names and "kvplan.cli.app" in names
    r = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], capture_output=True, text=True, cwd=REPO,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    failed = json.loads(r.stdout)
    assert failed == {}, "\n".join(f"{name}: {err}" for name, err in failed.items())


def test_wheel_contains_model_specs_and_finds_them(tmp_path):
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(tmp_path.glob("kvplan-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    specs = [n for n in names if n.startswith("kvplan/model_specs/") and n.endswith(".yaml")]
    repo_specs = list((REPO / "model_specs").glob("*/*.yaml"))
    assert len(specs) == len(repo_specs) > 0
    assert "kvplan/data/gpus.yaml" in names
    assert "kvplan/data/bundled_index.json" in names  # the shipped YAML, parsed (no PyYAML at start-up)
    # installed from the wheel (unpacked, no checkout on the path), the bundled specs are found
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = "import kvplan.model.sources as s; print(s.specs_dir()); print(len(s.bundled_ids()))"
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    where, count = out.stdout.split()
    assert Path(where).is_relative_to(site) and int(count) == len(repo_specs)
