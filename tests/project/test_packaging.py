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
# at module level (pydantic, typer, PyYAML, rich's parts; torch last, see below) and freezes them out of the
# collector, so no child imports them again (pydantic took 0.1 s of CPU in each of ~15 children) or copies their
# pages when its collector walks them. What a child imports is kvplan's own, in the order the module asks for it:
# what this test is about (an import cycle, a module that works only when another was imported first).
# torch in the parent made each of the ~140 forks cost ~14 ms (its pages), and only a few modules import it: the
# first round's children run without it, and a child that asks for it stops there (an exception no ``except``
# below BaseException takes; the finder remembers the ask even if one does) and runs again in a second round,
# forked once the parent has imported torch.
THIRD_PARTY = ("pydantic", "typer", "yaml", "rich.console", "rich.table", "rich.panel", "rich.text")
SECOND_ROUND = "torch"
_IMPORT_EACH = """
import gc, importlib, json, os, sys, traceback
for name in THIRD_PARTY:
    importlib.import_module(name)
assert not [m for m in sys.modules if m.partition(".")[0] == "kvplan"]


class Later(BaseException):
    pass


class AskedFor:
    \"\"\"A meta path finder of the first round's children: SECOND_ROUND's import stops the child.\"\"\"
    asked = False

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == SECOND_ROUND:
            AskedFor.asked = True
            raise Later(name)
        return None


def import_in_a_child(name, first_round):
    \"\"\"None (imported), "later" (asked for SECOND_ROUND in the first round) or the error.\"\"\"
    if not hasattr(os, "fork"):
        import subprocess
        r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True)
        return r.stderr[-500:] if r.returncode else None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        if first_round:
            sys.meta_path.insert(0, AskedFor())
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            if not AskedFor.asked:
                os.write(write, traceback.format_exc()[-500:].encode())
            code = 1
        os._exit(3 if AskedFor.asked else code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        err = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if first_round and os.waitstatus_to_exitcode(status) == 3:
        return "later"
    return (err or f"exit status {status}") if status else None


failed, later = {}, []
gc.freeze()
for name in sys.argv[1:]:
    err = import_in_a_child(name, hasattr(os, "fork"))
    if err == "later":
        later.append(name)
    elif err:
        failed[name] = err
importlib.import_module(SECOND_ROUND)
gc.freeze()
for name in later:
    err = import_in_a_child(name, False)
    if err:
        failed[name] = err
print(json.dumps({"failed": failed, "second_round": later}))
""".replace("THIRD_PARTY", repr(THIRD_PARTY)).replace("SECOND_ROUND", repr(SECOND_ROUND))


def test_every_module_imports_in_a_fresh_interpreter():
    names = [m.name for m in pkgutil.walk_packages(kvplan.__path__, "kvplan.")]
    assert "kvplan.memory" in names and "kvplan.cli.app" in names
    r = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], capture_output=True, text=True, cwd=REPO,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    failed = out["failed"]
    assert failed == {}, "\n".join(f"{name}: {err}" for name, err in failed.items())
    assert "kvplan.paged.pool" in out["second_round"]  # the torch modules ran, in the second round


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
