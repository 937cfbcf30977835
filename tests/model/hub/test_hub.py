"""kvplan.model.hub against a local Hub emulator (tests/hub_emulator.py): no network, no real weights."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kvplan.model import hub as kvhub
from kvplan.errors import ConfigError, HubError, KvplanError, ModelNotFoundError
from kvplan.model.sources import resolve_model

try:
    from tests.hub_emulator import HubEmulator, VirtualFile, safetensors_header
except ImportError:  # pragma: no cover - depends on how pytest was started
    from hub_emulator import HubEmulator, VirtualFile, safetensors_header  # type: ignore[no-redef]

REPO = "acme/tiny-llama"
TOKEN = "hf_SeCrEtToKeN0123456789"

# A tiny Llama-shaped config (the numbers only need to round-trip).
CONFIG_V1 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
CONFIG_V2 = {**CONFIG_V1, "num_hidden_layers": 6, "max_position_embeddings": 8192}

# Weights of the single-file repo, as (dtype, shape):
#   embed   BF16 [1000, 256] = 256,000 params x 2 B = 512,000 B
#   q_proj  BF16 [256, 256]  =  65,536 params x 2 B = 131,072 B
#   scale   F32  [256]       =     256 params x 4 B =   1,024 B
# parameters = 321,792; BF16 321,536, F32 256; total bytes = 644,096.
TENSORS = {
    "model.embed_tokens.weight": ("BF16", [1000, 256]),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", [256, 256]),
    "model.norm.weight": ("F32", [256]),
}
# Sharded repo: shard 1 as TENSORS; shard 2 one FP8 [512, 256] = 131,072 params x 1 B and one F4
# [100, 3] = 300 params x 4 bits = 150 B.
# parameters = 321,792 + 131,072 + 300 = 453,164; bytes = 644,096 + 131,072 + 150 = 775,318.
SHARD2 = {
    "model.layers.1.mlp.up_proj.weight": ("F8_E4M3", [512, 256]),
    "model.layers.1.mlp.packed": ("F4", [100, 3]),
}


def _single_file_repo() -> dict:
    return {"config.json": CONFIG_V1, "model.safetensors": VirtualFile.safetensors(TENSORS, {"format": "pt"})}


def _sharded_repo(total_size: int = 775_318) -> dict:
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    weight_map = {name: shard1 for name in TENSORS} | {name: shard2 for name in SHARD2}
    return {
        "config.json": CONFIG_V1,
        "model.safetensors.index.json": {"metadata": {"total_size": total_size}, "weight_map": weight_map},
        shard1: VirtualFile.safetensors(TENSORS),
        shard2: VirtualFile.safetensors(SHARD2),
    }


def _all_text(exc: BaseException) -> str:
    """Every message along the exception chain (what a traceback would show)."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current))
        if isinstance(current, KvplanError):
            parts.append(current.one_line())
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# the emulator's own format helpers


def test_safetensors_header_layout() -> None:
    prefix, size = safetensors_header({"w": ("BF16", [3, 5])})
    length = int.from_bytes(prefix[:8], "little")
    assert length == len(prefix) - 8 and length % 8 == 0
    header = json.loads(prefix[8:])
    # 3 x 5 = 15 elements x 2 B = 30 B of data after the header.
    assert header["w"] == {"dtype": "BF16", "shape": [3, 5], "data_offsets": [0, 30]}
    assert size == len(prefix) + 30


# ------------------------------------------------------------------------------------------------
# first fetch, cache, offline


def test_first_fetch_reads_config_and_safetensors_header(hub: HubEmulator) -> None:
    commit = hub.add_repo(REPO, _single_file_repo())
    source = kvhub.fetch_model(REPO)
    assert source.kind == "hub"
    assert source.model_id == REPO
    assert source.location == f"{hub.url}/{REPO}"
    assert source.revision == commit
    assert dict(source.config) == CONFIG_V1
    w = source.weights
    assert w is not None
    assert w.parameters == 321_792
    assert dict(w.params_by_dtype) == {"BF16": 321_536, "F32": 256}
    assert w.total_bytes == 644_096
    assert w.dtype == "BF16"
    assert "safetensors metadata" in w.source
    assert source.notes == ""
    # Never downloads weights: the Hub's model info holds the counts, so no request touches a weight file ...
    assert not [r for r in hub.requests if ".safetensors" in r.path or "/cdn/" in r.path]
    # ... and where the Hub has none, every GET of the safetensors file (at the Hub or the CDN) asks for a range.
    hub.model_info_safetensors = False
    hub.add_repo("acme/no-info", _single_file_repo())
    headers = kvhub.fetch_model("acme/no-info").weights
    assert headers is not None and (headers.parameters, headers.total_bytes) == (w.parameters, w.total_bytes)
    assert "safetensors metadata (1 file)" in headers.source
    weight_gets = [r for r in hub.requests if r.method == "GET" and (".safetensors" in r.path or "/cdn/" in r.path)]
    assert weight_gets and all(r.headers.get("range", "").startswith("bytes=0-") for r in weight_gets)


@pytest.mark.parametrize("model_info", [True, False], ids=["hub-counts", "headers"])
def test_sharded_repo_sums_every_shard(hub: HubEmulator, capfd: pytest.CaptureFixture[str], model_info: bool) -> None:
    # the Hub's counts per dtype cover every shard; where it has none, every shard's header is read
    hub.model_info_safetensors = model_info
    hub.add_repo(REPO, _sharded_repo())
    w = kvhub.fetch_model(REPO).weights
    assert capfd.readouterr() == ("", "")  # library code prints nothing: no progress bars
    assert w is not None
    assert dict(w.params_by_dtype) == {"BF16": 321_536, "F32": 256, "F8_E4M3": 131_072, "F4": 300}
    assert w.parameters == 453_164
    assert w.total_bytes == 775_318
    assert ("the Hub's parameters per dtype" if model_info else "2 files") in w.source


def test_second_fetch_answers_from_the_cache_without_a_request(hub: HubEmulator) -> None:
    """The Hub fast path: a cached model costs no network round trip, and the answer equals the online one."""
    commit = hub.add_repo(REPO, _sharded_repo())
    online = kvhub.fetch_model(REPO)
    seen = len(hub.requests)
    cached = kvhub.fetch_model(REPO)
    assert len(hub.requests) == seen  # not one request
    assert dict(cached.config) == CONFIG_V1 and cached.revision == commit
    assert cached.weights is not None and online.weights is not None
    assert (cached.weights.parameters, cached.weights.total_bytes, dict(cached.weights.params_by_dtype)) == (
        online.weights.parameters, online.weights.total_bytes, dict(online.weights.params_by_dtype))
    assert cached.describe() == (f"Hugging Face Hub {hub.url}/{REPO}@{commit} "
                                 f"(HF cache, commit {commit}; --refresh asks the Hub)")
    assert online.describe() == f"Hugging Face Hub {hub.url}/{REPO}@{commit}"
    # --refresh asks the Hub again: a branch that moved is seen.
    commit2 = hub.add_commit(REPO, {**_sharded_repo(), "config.json": CONFIG_V2}, refs=("main",))
    assert kvhub.fetch_model(REPO).revision == commit  # the cache still answers
    refreshed = kvhub.fetch_model(REPO, refresh=True)
    assert refreshed.revision == commit2 and refreshed.config["num_hidden_layers"] == 6
    assert len(hub.requests) > seen


def test_refresh_uses_cache_when_hub_is_gone(hub: HubEmulator) -> None:
    commit = hub.add_repo(REPO, _sharded_repo())
    kvhub.fetch_model(REPO)
    hub.stop()  # connection refused from now on
    source = kvhub.fetch_model(REPO, refresh=True)
    assert dict(source.config) == CONFIG_V1
    assert source.revision == commit
    assert source.notes == f"used the cached config.json: cannot reach the Hugging Face Hub at {hub.url} (ConnectError)"
    # The shards were never downloaded; kvplan kept the summary of the headers it read online.
    assert source.weights is not None and source.weights.total_bytes == 775_318
    assert source.weights.parameters == 453_164
    assert source.weights.source.endswith("(kvplan's summary)")


def test_without_the_summary_the_cached_index_gives_total_size(hub: HubEmulator, hf_home: Path) -> None:
    hub.model_info_safetensors = False  # the headers are read, so the index is cached
    hub.add_repo(REPO, _sharded_repo())
    kvhub.fetch_model(REPO)
    for summary in (hf_home / "assets" / "kvplan").rglob("*.json"):
        summary.unlink()
    w = kvhub.fetch_model(REPO, offline=True).weights
    # The index was cached by get_safetensors_metadata, the shards were never downloaded: total_size.
    assert w is not None and w.total_bytes == 775_318 and w.parameters is None


def test_cache_lookup_agrees_with_huggingface_hub(hub: HubEmulator, hf_home: Path) -> None:
    """kvplan reads the cache layout itself (no HTTP client import); huggingface_hub must agree."""
    from huggingface_hub import constants, try_to_load_from_cache

    c1 = hub.add_repo(REPO, _sharded_repo(), refs=("main", "v1"))
    kvhub.fetch_model(REPO)
    c2 = hub.add_commit(REPO, {**_sharded_repo(), "config.json": CONFIG_V2}, refs=("v2",))
    kvhub.fetch_model(REPO, revision="v2")
    req = kvhub.HubRequest(REPO, None, None, hub.url, str(constants.HF_HUB_CACHE))
    for revision in (None, "main", "v1", "v2", c1, c2, "no-such-ref", "0" * 40):
        for filename in ("config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"):
            theirs = try_to_load_from_cache(REPO, filename, cache_dir=req.cache_dir, revision=revision)
            ours = kvhub.cached_file(req, filename, revision)
            assert (str(ours) if ours else None) == (theirs if isinstance(theirs, str) else None), (revision, filename)


@pytest.mark.parametrize("body", [b'{"model_type": "llama\xff"}', b"\x00\x01binary", b"[" * 3000 + b"]" * 3000])
def test_a_config_that_does_not_parse_is_not_kept_in_the_cache(hub: HubEmulator, body: bytes) -> None:
    """Before: the bad file stayed cached, so every later --offline run failed on it (and with a traceback)."""
    commit = hub.add_repo(REPO, {"config.json": body})
    with pytest.raises(ConfigError) as info:
        kvhub.fetch_model(REPO)
    line = info.value.one_line()
    assert line.startswith(f"{hub.url}/{REPO}/config.json@{commit}: ") and "removed it from the HF cache" in line
    with pytest.raises(HubError, match="is not in the Hugging Face cache"):
        kvhub.fetch_model(REPO, offline=True)
    fixed = hub.add_commit(REPO, {"config.json": CONFIG_V1}, refs=("main",))
    assert kvhub.fetch_model(REPO).revision == fixed  # the next online run asks the Hub again


def test_cli_hub_config_not_utf8_is_one_line_exit_2(hub: HubEmulator) -> None:
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    hub.add_repo(REPO, {"config.json": b'{"model_type": "llama\xff", "num_hidden_layers": 2}'})
    r = CliRunner().invoke(app, ["estimate", REPO, "--json"])
    assert r.exit_code == 2 and (r.exception is None or isinstance(r.exception, SystemExit))
    err = r.stderr.strip()
    assert err.startswith("kvplan: error: ") and "\n" not in err and "not valid UTF-8 (byte 0xff at offset 21)" in err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_offline_after_caching(hub: HubEmulator, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    commit = hub.add_repo(REPO, _single_file_repo())
    kvhub.fetch_model(REPO)
    seen = len(hub.requests)
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = kvhub.fetch_model(REPO, offline=(how == "flag"))
    assert len(hub.requests) == seen  # not one request in offline mode
    assert dict(source.config) == CONFIG_V1
    assert source.revision == commit
    by = "--offline" if how == "flag" else "HF_HUB_OFFLINE"
    assert source.notes == f"config.json from the HF cache ({by}: no network)"
    # Single-file repo, weights never downloaded: the header summary kvplan kept online answers.
    assert source.weights is not None and source.weights.parameters == 321_792
    assert source.weights.total_bytes == 644_096 and source.weights.source.endswith("(kvplan's summary)")


def test_offline_without_any_cached_weight_facts(hub: HubEmulator, hf_home: Path) -> None:
    hub.add_repo(REPO, _single_file_repo())
    kvhub.fetch_model(REPO)
    for summary in (hf_home / "assets" / "kvplan").rglob("*.json"):
        summary.unlink()
    source = kvhub.fetch_model(REPO, offline=True)
    assert source.weights is None
    assert source.notes == ("config.json from the HF cache (--offline: no network); "
                            "weight size unknown (no safetensors header or index cached)")


def test_offline_flag_leaves_environment_alone(hub: HubEmulator) -> None:
    import os

    from huggingface_hub import constants

    hub.add_repo(REPO, _single_file_repo())
    with pytest.raises(HubError):
        kvhub.fetch_model(REPO, offline=True)
    assert "HF_HUB_OFFLINE" not in os.environ
    assert constants.HF_HUB_OFFLINE is False
    assert kvhub.fetch_model(REPO).config["num_hidden_layers"] == 4  # online still works afterwards


def test_offline_reads_weights_from_cached_safetensors(hub: HubEmulator, hf_home: Path) -> None:
    from huggingface_hub import hf_hub_download

    hub.add_repo(REPO, _single_file_repo())
    kvhub.fetch_model(REPO)
    # A user who has downloaded the checkpoint (vLLM would): the header is read from the cached file.
    hf_hub_download(REPO, "model.safetensors")
    w = kvhub.fetch_model(REPO, offline=True).weights
    assert w is not None and w.parameters == 321_792 and w.total_bytes == 644_096
    assert "cached model.safetensors header" in w.source


def test_offline_not_cached_fails_fast(hub: HubEmulator, hf_home: Path) -> None:
    hub.add_repo(REPO, _single_file_repo())
    start = time.perf_counter()
    with pytest.raises(HubError) as info:
        kvhub.fetch_model(REPO, offline=True)
    elapsed = time.perf_counter() - start
    print(f"offline, not cached: failed in {elapsed * 1000:.1f} ms")
    msg = info.value.message
    assert msg.startswith("--offline is set and acme/tiny-llama is not in the Hugging Face cache at ")
    assert str(hf_home) in msg
    assert "drop --offline" in (info.value.hint or "")
    assert hub.requests == []


def test_offline_env_not_cached_names_the_variable(hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match=r"^HF_HUB_OFFLINE is set and acme/tiny-llama@v9 is not in the"):
        kvhub.fetch_model(REPO, revision="v9")
    assert hub.requests == []


# ------------------------------------------------------------------------------------------------
# revisions


@pytest.mark.parametrize("model_info", [True, False], ids=["hub-counts", "headers"])
def test_revision_pinning(hub: HubEmulator, model_info: bool) -> None:
    hub.model_info_safetensors = model_info
    c1 = hub.add_repo(REPO, _single_file_repo(), refs=("main", "v1"))
    c2 = hub.add_commit(REPO, {**_single_file_repo(), "config.json": CONFIG_V2}, refs=("v2",))
    assert c1 != c2
    assert kvhub.fetch_model(REPO).config["num_hidden_layers"] == 4
    by_tag = kvhub.fetch_model(REPO, revision="v2")
    assert by_tag.config["num_hidden_layers"] == 6 and by_tag.revision == c2
    by_sha = kvhub.fetch_model(REPO, revision=c1)
    assert by_sha.config["num_hidden_layers"] == 4 and by_sha.revision == c1
    # The counts (or the headers) were read at the pinned commit, not at main.
    pinned = f"/api/models/{REPO}/revision/{c2}" if model_info else f"/resolve/{c2}/model.safetensors"
    assert any(pinned in r.path for r in hub.requests)
    # Both revisions are cached side by side.
    assert kvhub.fetch_model(REPO, revision="v2", offline=True).config["num_hidden_layers"] == 6
    assert kvhub.fetch_model(REPO, revision=c1, offline=True).config["num_hidden_layers"] == 4
    # A tag never fetched online has no ref in the cache.
    with pytest.raises(HubError, match="is not in the Hugging Face cache"):
        kvhub.fetch_model(REPO, revision="v1", offline=True)


def test_missing_revision(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo())
    with pytest.raises(HubError) as info:
        kvhub.fetch_model(REPO, revision="no-such-branch")
    assert info.value.message == f"{REPO} has no revision 'no-such-branch' on {hub.url}"
    assert "--revision" in (info.value.hint or "")


# ------------------------------------------------------------------------------------------------
# access


def test_gated_without_token(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo(), gated=True, granted_tokens=(TOKEN,))
    with pytest.raises(HubError) as info:
        kvhub.fetch_model(REPO)
    assert not isinstance(info.value, ModelNotFoundError)
    assert info.value.message == f"{REPO} is a gated repository on {hub.url} and no token was sent"
    hint = info.value.hint or ""
    assert "--token" in hint and "HF_TOKEN" in hint and "hf auth login" in hint


def test_gated_with_token(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo(), gated=True, granted_tokens=(TOKEN,))
    source = kvhub.fetch_model(REPO, token=TOKEN)
    assert source.weights is not None and source.weights.parameters == 321_792
    resolves = hub.requests_for(f"/{REPO}/resolve/")
    assert resolves and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in resolves)
    # The token stays on the Hub: the CDN (another origin) never sees it.
    assert all("authorization" not in r.headers for r in hub.requests_for("/cdn/"))


def test_gated_token_from_hf_token_env(hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_repo(REPO, _single_file_repo(), gated=True, granted_tokens=(TOKEN,))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert kvhub.fetch_model(REPO).config["num_hidden_layers"] == 4
    assert hub.requests[0].headers.get("authorization") == f"Bearer {TOKEN}"


def test_token_never_in_error_text(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo(), gated=True, granted_tokens=("hf_other",))
    with pytest.raises(HubError) as info:
        kvhub.fetch_model(REPO, token=TOKEN)
    assert "token sent has not been granted access" in info.value.message
    assert TOKEN not in _all_text(info.value)
    for mode in ("error500", "drop"):
        hub.mode = mode
        with pytest.raises(HubError) as info:
            kvhub.fetch_model("acme/other", token=TOKEN)
        assert TOKEN not in _all_text(info.value)


def test_invalid_token_is_reported_without_echoing_it(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo())
    hub.valid_tokens = {"hf_known"}
    with pytest.raises(HubError) as info:
        kvhub.fetch_model(REPO, token=TOKEN)
    assert info.value.message == f"the Hub at {hub.url} rejected the token (HTTP 401) for {REPO}"
    assert TOKEN not in _all_text(info.value)


def test_repo_not_found(hub: HubEmulator) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        kvhub.fetch_model("acme/does-not-exist")
    assert info.value.message == f"no model repository 'acme/does-not-exist' on {hub.url}"
    assert "private/gated: pass --token or set HF_TOKEN" in (info.value.hint or "")


def test_invalid_repo_id_is_model_not_found(hub: HubEmulator) -> None:
    with pytest.raises(ModelNotFoundError, match="not a valid Hugging Face repo id"):
        kvhub.fetch_model("acme/bad--name/extra")
    assert hub.requests == []


def test_config_missing_in_repo(hub: HubEmulator) -> None:
    hub.add_repo(REPO, {"README.md": "# no config here"})
    with pytest.raises(HubError) as info:
        kvhub.fetch_model(REPO)
    assert info.value.message == f"{REPO} has no config.json at {hub.url}/{REPO}"


# ------------------------------------------------------------------------------------------------
# a failing Hub


def test_server_error_names_status_and_endpoint(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo())
    hub.mode = "error500"
    with pytest.raises(HubError) as info:
        kvhub.fetch_model(REPO)
    assert f"the Hub at {hub.url} answered HTTP 500" in info.value.message
    # Fail fast: one HEAD, no retries.
    assert len(hub.requests) == 1


def test_server_error_falls_back_to_cache(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo())
    kvhub.fetch_model(REPO)
    hub.mode = "error500"
    source = kvhub.fetch_model(REPO, refresh=True)
    assert source.config["hidden_size"] == 256
    assert source.notes == f"used the cached config.json: the Hub at {hub.url} answered HTTP 500 (server error) for {REPO}"


def test_dropped_connection(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo())
    hub.mode = "drop"
    with pytest.raises(HubError) as info:
        kvhub.fetch_model(REPO)
    assert info.value.message.startswith(f"cannot reach the Hugging Face Hub at {hub.url} (")
    assert "is not in the cache at" in info.value.message
    assert len(hub.requests) == 1


def test_unreachable_endpoint_names_it(hub: HubEmulator) -> None:
    hub.add_repo(REPO, _single_file_repo())
    hub.stop()
    with pytest.raises(HubError, match=rf"^cannot reach the Hugging Face Hub at {hub.url} \(ConnectError\)"):
        kvhub.fetch_model(REPO)


# ------------------------------------------------------------------------------------------------
# weight facts without safetensors headers


def test_no_safetensors_means_no_weight_facts(hub: HubEmulator) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG_V1, "pytorch_model.bin": b"\x80\x04not-loaded"})
    source = kvhub.fetch_model(REPO)
    assert source.weights is None
    assert "no safetensors weights" in source.notes
    assert not hub.requests_for("pytorch_model.bin")  # never touched


def test_broken_shard_header_falls_back_to_index_total_size(hub: HubEmulator) -> None:
    files = _sharded_repo(total_size=999_999)
    # Header length prefix claims 2**40 bytes: not a safetensors header.
    files["model-00002-of-00002.safetensors"] = VirtualFile((2**40).to_bytes(8, "little"), 64)
    hub.add_repo(REPO, files)
    source = kvhub.fetch_model(REPO)
    assert source.weights is not None
    assert source.weights.total_bytes == 999_999  # metadata.total_size of the (cached) index
    assert source.weights.parameters is None
    assert "cached model.safetensors.index.json metadata.total_size" == source.weights.source
    assert "safetensors headers unavailable" in source.notes


# ------------------------------------------------------------------------------------------------
# through kvplan.model.sources


def test_resolve_model_force_hub_goes_through_hub_module(hub: HubEmulator) -> None:
    commit = hub.add_repo(REPO, _single_file_repo())
    source = resolve_model(REPO, force_hub=True)
    assert source.kind == "hub" and source.revision == commit
    assert source.describe() == f"Hugging Face Hub {hub.url}/{REPO}@{commit}"
    assert hub.requests_for(f"/{REPO}/resolve/main/config.json")
