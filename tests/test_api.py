"""The Python API: estimate, sweep and check return the same frozen objects the CLI renders."""

import pytest

import kvplan
from kvplan.errors import KvplanError

LLAMA = "meta-llama/Llama-3.1-8B"


def test_sweep_from_a_mapping_matches_single_estimates():
    report = kvplan.sweep({"defaults": {"context": "8k"},
                           "sweep": {"model": [LLAMA], "gpu": ["H100", "A100-40GB"], "batch": [1, 64]}})
    assert [(r.pool.plan.gpu.name, r.batch) for r in report.rows] == [
        ("H100-SXM-80GB", 1), ("H100-SXM-80GB", 64), ("A100-SXM-40GB", 1), ("A100-SXM-40GB", 64)]
    for row in report.rows:
        single = kvplan.estimate(LLAMA, gpu=row.pool.plan.gpu.name, context=8192, batch=row.batch)
        assert (row.kv_tokens, row.max_requests, row.fits) == (single.answer.kv_tokens, single.answer.max_requests,
                                                               single.answer.fits)


def test_check_from_a_mapping():
    report = kvplan.check({"defaults": {"model": LLAMA, "gpu": "H100", "context": "8k"},
                           "checks": [{"name": "fits-32", "require": {"concurrency": 32}},
                                      {"name": "fits-500", "require": {"concurrency": 500}}]})
    passed = {r.name: all(o.passed for o in r.outcomes) for r in report.results}
    assert passed == {"fits-32": True, "fits-500": False}


def test_api_errors_are_kvplan_errors_with_locations():
    with pytest.raises(KvplanError, match=r"<sweep>:2:3: defaults.contxt: unknown key"):
        kvplan.sweep({"defaults": {"contxt": "8k"}, "sweep": {"model": [LLAMA]}})


def test_api_functions_survive_submodule_imports():
    """Importing every submodule must not shadow kvplan.estimate / sweep / check."""
    import importlib
    import pkgutil

    for mod in pkgutil.walk_packages(kvplan.__path__, "kvplan."):
        if not mod.name.startswith(("kvplan.paged.", "kvplan.commands.")):
            importlib.import_module(mod.name)
    assert all(callable(getattr(kvplan, name)) and not isinstance(getattr(kvplan, name), type(kvplan))
               for name in ("estimate", "sweep", "check"))
