"""The Python API: estimate, sweep and check return the same frozen objects the CLI renders."""

import copy

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
        if not mod.name.startswith(("kvplan.paged.", "kvplan.cli.commands.")):
            importlib.import_module(mod.name)
    assert all(callable(getattr(kvplan, name)) and not isinstance(getattr(kvplan, name), type(kvplan))
               for name in ("estimate", "sweep", "check"))


# ---------------------------------------------------------------------------------------------
# wrong-typed arguments: a KvplanError naming the function and the argument, before any work

from dataclasses import fields  # noqa: E402
from pathlib import Path  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

from kvplan import api  # noqa: E402
from kvplan.errors import InputError  # noqa: E402
from kvplan.options import BY_NAME, KINDS, Options  # noqa: E402

ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.complex_numbers(), st.text(max_size=8),
    st.binary(max_size=8), st.lists(st.integers(), max_size=3), st.tuples(st.integers()),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.sets(st.integers(), max_size=2),
    st.builds(object), st.just(Path("capacity.yaml")), st.just(Ellipsis),
)


def _wrong(types: tuple[type, ...]):
    """Values that are none of ``types`` (a bool counts as a number only where bool is listed)."""
    def is_accepted(v):
        if isinstance(v, bool) and bool not in types:
            return False
        return isinstance(v, types)

    return ANY_VALUE.filter(lambda v: not is_accepted(v))


# what each API argument takes (besides the option values, which kvplan.api.KIND_TYPES gives per kind)
ARGUMENTS = {
    ("estimate", "model"): (str, Path),
    ("estimate", "token"): (str, type(None)),
    ("sweep", "whatif"): (str, Path, dict),
    ("check", "capacity"): (str, Path, dict),
    ("sweep", "offline"): (bool,),
    ("check", "offline"): (bool,),
    ("sweep", "token"): (str, type(None)),
    ("check", "token"): (str, type(None)),
}
DOC = {"defaults": {"model": LLAMA}, "checks": [{"name": "c", "require": {"concurrency": 1}}]}


def _call(function: str, argument: str, value):
    """``kvplan.<function>`` with one argument replaced by ``value`` and the others valid."""
    if function == "estimate":
        kwargs = {"model": LLAMA, argument: value}
        return kvplan.estimate(kwargs.pop("model"), **kwargs)
    first = {"sweep": "whatif", "check": "capacity"}[function]
    kwargs = {first: DOC, argument: value}
    return getattr(kvplan, function)(kwargs.pop(first), **kwargs)


# each argument's strategy built once (a strategy made inside ``flatmap`` is new, and validated again, each example)
WRONG_ARGUMENT = {key: st.tuples(st.just(key), _wrong(types)) for key, types in ARGUMENTS.items()}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(ARGUMENTS)).flatmap(WRONG_ARGUMENT.__getitem__))
def test_a_wrong_typed_argument_is_an_input_error_naming_it(case):
    (function, argument), value = case
    with pytest.raises(InputError, match=rf"^kvplan\.{function}\(\): {argument} must be .*, got {type(value).__name__}"):
        _call(function, argument, value)


OPTION_NAMES = sorted(o.name for o in BY_NAME.values() if o.name not in ("model", "token"))
FIELD_NAMES = sorted(f.name for f in fields(Options) if f.name not in BY_NAME and f.name != "model")


WRONG_OPTION = {name: st.tuples(st.just(name), _wrong(api.option_type(name)[0]).filter(lambda v: v is not None))
                for name in OPTION_NAMES + FIELD_NAMES}  # built once, as WRONG_ARGUMENT


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(OPTION_NAMES + FIELD_NAMES).flatmap(WRONG_OPTION.__getitem__))
def test_a_wrong_typed_option_is_an_input_error_naming_it(case):
    """Every option, by its name (``context="8k"``) or its Options field (``gpu_count=2``): ``None`` is the
    default; any other value of a type the option does not take is refused before planning."""
    name, value = case
    with pytest.raises(InputError, match=rf"^kvplan\.estimate\(\): {name} must be "):
        kvplan.estimate(LLAMA, **{name: value})


def test_the_api_types_cover_every_kind_of_option():
    assert set(api.KIND_TYPES) == set(KINDS)
    assert {str(f.type).removesuffix(" | None") for f in fields(Options) if f.name not in BY_NAME} <= set(api.FIELD_TYPES)


@pytest.mark.parametrize("call, message", [
    (lambda: kvplan.estimate(model=None), r"estimate\(\): model must be a model id or a path .*got NoneType None"),
    (lambda: kvplan.check(None), r"check\(\): capacity must be a YAML file path .*got NoneType"),
    (lambda: kvplan.check(42), r"check\(\): capacity must be .*got int 42"),
    (lambda: kvplan.check([1, 2]), r"check\(\): capacity must be .*got list \[1, 2\]"),
    (lambda: kvplan.sweep(42), r"sweep\(\): whatif must be .*got int 42"),
    (lambda: kvplan.sweep(b".."), r"sweep\(\): whatif must be .*got bytes b'\.\.'"),
    (lambda: kvplan.estimate(LLAMA, revision=5), r"estimate\(\): revision must be a string, got int 5"),
    (lambda: kvplan.estimate(LLAMA, enforce_eager="yes"), r"enforce_eager must be True or False, got str 'yes'"),
    (lambda: kvplan.check("capacity\x00.yaml"), r"check\(\): capacity contains a NUL character"),
])
def test_the_acceptance_testers_cases(call, message):
    with pytest.raises(InputError, match=message):
        call()


@pytest.mark.parametrize("doc, where", [
    ({"defaults": {"model": LLAMA, "context": object()}, "checks": []}, r"capacity\['defaults'\]\['context'\]"),
    ({"defaults": {"model": LLAMA}, "checks": [{"name": "c", "require": {"fits": {1, 2}}}]},
     r"capacity\['checks'\]\[0\]\['require'\]\['fits'\] must be a string, number, bool, None, list or mapping, got set"),
    ({"defaults": {1: "x"}}, r"a key of capacity\['defaults'\] must be a string, got int 1"),
])
def test_a_mapping_with_a_value_yaml_cannot_hold_names_where_it_is(doc, where):
    with pytest.raises(InputError, match=where):
        kvplan.check(doc)


def test_a_mapping_nested_past_the_yaml_bound_is_refused():
    from kvplan.io.yamldoc import MAX_YAML_DEPTH

    doc: dict = {}
    inner = doc
    for _ in range(MAX_YAML_DEPTH + 1):
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(InputError, match=f"nested more than {MAX_YAML_DEPTH} levels deep"):
        kvplan.check(doc)
    shared: list = [1]
    for _ in range(25):  # 2^25 values once expanded, from 25 lists that share each other
        shared = [shared, shared]
    with pytest.raises(InputError, match="holds more than 1,000,000 values"):
        kvplan.sweep({"sweep": {"context": shared}})


def test_a_shared_list_counts_at_every_use_and_nests_where_it_is_used():
    """Values a document shares (as YAML's aliases share them) count once per use, walked once; a shared part
    that nests past the bound only where it is used again is refused there, by its path."""
    from kvplan.api import document
    from kvplan.io.yamldoc import MAX_YAML_DEPTH, MAX_YAML_VALUES

    shared: list = [1]
    for _ in range(19):  # 2^19 ones, 2^20 - 1 lists: 1,572,863 values once expanded
        shared = [shared, shared]
    with pytest.raises(InputError, match="holds more than 1,000,000 values"):
        document("sweep", "config", {"a": shared})
    half = shared[0][0]  # 2^17 ones in 2^18 - 1 lists: 393,215 values; twice is under the bound, three times is not
    assert 2 * (2 ** 17 + 2 ** 18 - 1) + 3 <= MAX_YAML_VALUES < 3 * (2 ** 17 + 2 ** 18 - 1)
    assert document("sweep", "config", {"a": half, "b": half}) == {"a": half, "b": half}
    with pytest.raises(InputError, match="holds more than"):
        document("sweep", "config", {"a": half, "b": half, "c": half})
    deep: dict = {}
    inner = deep
    for _ in range(MAX_YAML_DEPTH - 3):
        inner["a"] = {}
        inner = inner["a"]
    assert document("check", "config", {"x": deep})["x"] == deep
    nested = {"x": deep, "y": {"z": {"w": {"v": deep}}}}  # deep is fine at its first use, too deep at its second
    for doc in (nested, copy.deepcopy(nested)):  # shared or not, the same refusal
        with pytest.raises(InputError, match=r"config\['y'\]\['z'\]\['w'\]\['v'\](\['a'\])+ is nested more than"):
            document("check", "config", doc)


YAML_DATA = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6)),
                         lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                 st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                         max_leaves=12)
KEYS = st.sampled_from(["defaults", "checks", "sweep", "model", "context", "require", "name", "gpu", "zip"])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["sweep", "check"]), st.dictionaries(KEYS, YAML_DATA, max_size=3))
def test_any_plain_mapping_gives_a_report_or_a_kvplan_error(function, doc):
    try:
        getattr(kvplan, function)(doc, offline=True)
    except KvplanError:
        pass


@pytest.mark.parametrize("model", [
    "x/" * 3000,  # longer than the OS's file-name limit: not a path, and not a Hub id either
    "~no-such-user-kvplan/org/config.json",  # a home directory the OS cannot resolve
])
def test_a_model_name_the_os_cannot_look_up_is_a_model_error(model):
    with pytest.raises(KvplanError) as err:
        kvplan.estimate(model, offline=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("option", ["kv_dtype", "dtype", "quantization", "engine_version", "gpu"])
def test_an_empty_text_option_is_an_error_not_the_default(option):
    with pytest.raises(InputError, match="must not be empty"):
        kvplan.estimate("meta-llama/Llama-3.1-8B", **{option: " "})


def test_the_python_api_suggests_an_option_and_lists_only_itself():
    with pytest.raises(InputError) as err:
        kvplan.estimate(LLAMA, gpux="H100")
    assert str(err.value).endswith("did you mean 'gpu'?")
    assert dir(kvplan) == sorted(kvplan.__all__) == ["__version__", "check", "estimate", "size", "sweep"]


@pytest.mark.parametrize("function, typo, meant", [
    ("estimate", "contxt", "context"), ("estimate", "gpu_utl", "gpu_util"), ("estimate", "kv_dtyp", "kv_dtype"),
    ("estimate", "tokn", "token"), ("estimate", "max_model_length", "max_model_len"),
    ("sweep", "ofline", "offline"), ("sweep", "tokens", "token"), ("check", "offlin", "offline"), ("check", "tokn", "token"),
])
def test_every_api_function_names_the_option_a_typo_meant(function, typo, meant):
    # every public function's keywords: a mistyped one is a kvplan error whose own message (what a traceback
    # shows) names the closest option, never a TypeError
    import kvplan

    first = "meta-llama/Llama-3.1-8B" if function == "estimate" else {"defaults": {}}
    with pytest.raises(kvplan.errors.InputError) as info:
        getattr(kvplan, function)(first, **{typo: 1})
    assert str(info.value) == f"kvplan.{function}(): unknown option {typo!r}; did you mean {meant!r}?"


def test_an_unknown_api_option_with_nothing_close_lists_the_options():
    import kvplan

    with pytest.raises(kvplan.errors.InputError) as info:
        kvplan.sweep({"defaults": {}}, zzz=1)
    assert str(info.value) == "kvplan.sweep(): unknown option 'zzz'" and info.value.hint == "its options: offline, token"
