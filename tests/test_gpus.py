"""The GPU catalogue: data sanity, forgiving lookup, clear errors for a broken data file."""

from __future__ import annotations

import json

import pytest

from kvplan.errors import ConfigError, GpuNotFoundError, InputError
from kvplan.gpus import (
    DATA_FILE,
    Gpu,
    custom_gpu,
    find_gpu,
    load_gpus,
    normalize_gpu_name,
    parse_catalogue,
)
from kvplan.units import GB, GiB, parse_bytes

GPUS = load_gpus()
REAL = [g for g in GPUS if not g.is_cpu]


def test_catalogue_has_at_least_22_entries_with_unique_names():
    assert len(GPUS) >= 22
    names = [g.name for g in GPUS]
    assert len(names) == len(set(names))
    assert all(isinstance(g, Gpu) for g in GPUS)


def test_load_is_cached():
    assert load_gpus() is load_gpus()


def test_data_file_lives_in_the_package():
    assert DATA_FILE.name == "gpus.yaml"
    assert DATA_FILE.parent.name == "data"
    assert DATA_FILE.parent.parent.name == "kvplan"


@pytest.mark.parametrize("gpu", REAL, ids=lambda g: g.name)
def test_memory_is_below_the_box_and_not_absurdly_low(gpu: Gpu):
    # The runtime total sits below the DRAM on the box (marketing "80 GB" is 80 GiB of HBM) but, with
    # well under 10% reserved, above 90% of the box in decimal GB: 0.9 x 80e9 = 72e9 < 85.0e9 < 80 x 2**30.
    assert isinstance(gpu.memory_bytes, int) and gpu.memory_bytes > 0
    assert gpu.marketing_gb is not None
    assert gpu.memory_bytes < gpu.marketing_gb * GiB
    assert gpu.memory_bytes > 0.9 * gpu.marketing_gb * GB


@pytest.mark.parametrize("gpu", REAL, ids=lambda g: g.name)
def test_every_gpu_has_bandwidth_and_sources(gpu: Gpu):
    assert isinstance(gpu.bandwidth_bytes_per_s, int)
    # every entry here is between the DGX Spark's unified LPDDR5x (GB10, 273 GB/s) and a Blackwell (8 TB/s)
    assert 250 * 10**9 <= gpu.bandwidth_bytes_per_s <= 8 * 10**12
    assert gpu.bandwidth_source
    # a memory figure says plainly whether it was observed or derived
    assert gpu.memory_source.startswith(("observed", "DERIVED"))
    assert gpu.memory_is_derived == gpu.memory_source.startswith("DERIVED")


def test_cpu_target_has_no_memory_of_its_own():
    cpu = find_gpu("cpu")
    assert cpu.is_cpu
    assert cpu.memory_bytes is None
    assert cpu.bandwidth_bytes_per_s is None
    assert sum(g.is_cpu for g in GPUS) == 1


def test_h100_sxm_memory_is_what_cuda_reports_not_the_box_or_nvidia_smi():
    h100 = find_gpu("H100-SXM-80GB")
    # CUDA reports ~79.19 GiB; nvidia-smi says 81,559 MiB = 79.65 GiB; the box says 80 GB.
    assert 79.1 * GiB < h100.memory_bytes < 79.3 * GiB
    assert h100.memory_bytes < 81559 * 2**20
    assert h100.bandwidth_bytes_per_s == 3_350_000_000_000


def test_other_reference_sizes():
    # hand-checkable GiB figures from the runtime logs cited in the data file
    assert 79.1 * GiB < find_gpu("a100").memory_bytes < 79.2 * GiB       # 84,987,740,160 B = 79.15 GiB
    assert 21.9 * GiB < find_gpu("l4").memory_bytes < 22.1 * GiB         # 23,612,293,120 B = 21.99 GiB
    assert 23.4 * GiB < find_gpu("4090").memory_bytes < 23.7 * GiB       # 25,250,627,584 B = 23.52 GiB
    assert find_gpu("mi300x").memory_bytes == 196592 * 2**20             # rocm-smi 206,141,652,992 B


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("h100", "H100-SXM-80GB"),
        ("H100-80GB", "H100-SXM-80GB"),
        ("H100 SXM", "H100-SXM-80GB"),
        ("h100-sxm", "H100-SXM-80GB"),
        ("H100 SXM5", "H100-SXM-80GB"),
        ("  h100_sxm_80gb ", "H100-SXM-80GB"),
        ("h100-pcie", "H100-PCIe-80GB"),
        ("h100 nvl", "H100-NVL-94GB"),
        ("a100", "A100-SXM-80GB"),
        ("a100-80g", "A100-SXM-80GB"),
        ("A100 80GiB", "A100-SXM-80GB"),
        ("a100-40gb", "A100-SXM-40GB"),
        ("a10", "A10-24GB"),
        ("a10g", "A10G-24GB"),
        ("l40", "L40-48GB"),
        ("l40s", "L40S-48GB"),
        ("h20", "H20-96GB"),
        ("h200", "H200-SXM-141GB"),
        ("mi300x", "MI300X-192GB"),
        ("MI325X", "MI325X-256GB"),
        ("rtx 4090", "RTX-4090-24GB"),
        ("4090", "RTX-4090-24GB"),
        ("rtx4090", "RTX-4090-24GB"),
        ("RTX-3090", "RTX-3090-24GB"),
        ("5090", "RTX-5090-32GB"),
        ("5080", "RTX-5080-16GB"),
        ("rtx pro 6000", "RTX-PRO-6000-Blackwell-96GB"),
        ("dgx spark", "GB10"),
        ("mi355x", "MI355X-288GB"),
        ("a40", "A40-48GB"),
        ("gh200", "GH200-96GB"),
        ("CPU", "cpu"),
    ],
)
def test_alias_lookup(query: str, name: str):
    assert find_gpu(query).name == name


@pytest.mark.parametrize(
    ("device_name", "name"),
    [
        # what torch.cuda.get_device_name() prints on these parts
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA H200", "H200-SXM-141GB"),
        ("NVIDIA B200", "B200-180GB"),
        ("NVIDIA B300 SXM6 AC", "B300-288GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
        ("NVIDIA A10G", "A10G-24GB"),
        ("NVIDIA L4", "L4-24GB"),
        ("NVIDIA L40S", "L40S-48GB"),
        ("Tesla T4", "T4-16GB"),
        ("NVIDIA RTX A6000", "RTX-A6000-48GB"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada-48GB"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090-24GB"),
        ("AMD Instinct MI300X", "MI300X-192GB"),
        ("AMD Instinct MI250X", "MI250X-GCD-64GB"),
        ("NVIDIA GeForce RTX 5080", "RTX-5080-16GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Blackwell-96GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-Blackwell-96GB"),
        ("NVIDIA GB10", "GB10"),
        ("NVIDIA A40", "A40-48GB"),
        ("NVIDIA GH200 480GB", "GH200-96GB"),
        ("AMD Instinct MI355X", "MI355X-288GB"),
    ],
)
def test_runtime_device_names_resolve(device_name: str, name: str):
    assert find_gpu(device_name).name == name


def test_every_name_and_alias_resolves_to_its_own_gpu():
    for gpu in GPUS:
        for label in (gpu.name, *gpu.aliases):
            assert find_gpu(label) is gpu, label


def test_no_alias_collides_across_gpus():
    owner: dict[str, str] = {}
    for gpu in GPUS:
        for label in (gpu.name, *gpu.aliases):
            key = normalize_gpu_name(label)
            assert owner.setdefault(key, gpu.name) == gpu.name, (label, owner[key])


def test_normalize():
    assert normalize_gpu_name("NVIDIA H100 80GB HBM3") == "h10080hbm3"
    assert normalize_gpu_name("a100-80g") == normalize_gpu_name("A100_80GiB") == "a10080"
    assert normalize_gpu_name("a10g") == "a10g"  # the G of A10G is not a size suffix
    assert normalize_gpu_name("NVIDIA GeForce RTX 4090") == "rtx4090"


def test_unknown_gpu_lists_the_closest_names():
    with pytest.raises(GpuNotFoundError) as info:
        find_gpu("H1000")
    err = info.value
    assert err.message == "unknown GPU 'H1000'"
    assert err.hint.startswith("closest: ")
    closest = err.hint.removeprefix("closest: ").split(";")[0].split(", ")
    assert closest[0] == "H100-SXM-80GB"
    assert len(closest) == 3
    assert "--gpu-memory" in err.hint


def test_unknown_gpu_with_nothing_close_still_helps():
    with pytest.raises(GpuNotFoundError) as info:
        find_gpu("zzzzzzzz")
    assert "closest" not in info.value.hint
    assert "--gpu-memory" in info.value.hint


def test_custom_gpu():
    gpu = custom_gpu(parse_bytes("24GiB"))
    assert gpu.memory_bytes == 24 * 2**30 == 25_769_803_776
    assert gpu.name == "custom" and gpu.is_custom and not gpu.is_cpu
    assert gpu.bandwidth_bytes_per_s is None
    fast = custom_gpu(80 * GiB, name="my-box", bandwidth_bytes_per_s=2_000_000_000_000)
    assert fast.name == "my-box" and fast.bandwidth_bytes_per_s == 2 * 10**12


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "24GiB", None])
def test_custom_gpu_rejects_bad_memory(bad):
    with pytest.raises(InputError):
        custom_gpu(bad)


def test_custom_gpu_rejects_bad_bandwidth():
    with pytest.raises(InputError):
        custom_gpu(GiB, bandwidth_bytes_per_s=0)


def test_to_dict_is_json_ready():
    data = find_gpu("h100").to_dict()
    assert json.loads(json.dumps(data))["memory_bytes"] == find_gpu("h100").memory_bytes
    assert isinstance(data["aliases"], list)


# ---------------------------------------------------------------------------------------------
# a broken data file says which entry and field


def _record(**overrides):
    record = {
        "name": "X1-16GB", "vendor": "nvidia", "marketing": "16 GB", "marketing_gb": 16,
        "memory_bytes": 15 * GiB, "memory_source": "observed: test",
        "bandwidth_bytes_per_s": 10**12, "bandwidth_source": "test", "aliases": ["x1"],
    }
    record.update(overrides)
    return record


def test_parse_catalogue_accepts_a_good_record():
    (gpu,) = parse_catalogue({"gpus": [_record()]}, "t.yaml")
    assert gpu.name == "X1-16GB" and gpu.memory_bytes == 15 * GiB and gpu.aliases == ("x1",)


def test_missing_field_is_named():
    record = _record()
    del record["memory_source"]
    with pytest.raises(ConfigError, match=r"t\.yaml: gpus\[0\] \(X1-16GB\): field 'memory_source' is missing"):
        parse_catalogue({"gpus": [record]}, "t.yaml")


@pytest.mark.parametrize("bad", ["80GB", -5, 0, 1.5e9, True])
def test_bad_memory_number_is_named(bad):
    with pytest.raises(ConfigError, match="field 'memory_bytes' must be a positive integer"):
        parse_catalogue({"gpus": [_record(memory_bytes=bad)]}, "t.yaml")


def test_null_memory_only_for_cpu():
    with pytest.raises(ConfigError, match="field 'memory_bytes' is required"):
        parse_catalogue({"gpus": [_record(memory_bytes=None)]}, "t.yaml")
    (cpu,) = parse_catalogue({"gpus": [_record(memory_bytes=None, is_cpu=True)]}, "t.yaml")
    assert cpu.is_cpu and cpu.memory_bytes is None


def test_bad_bandwidth_and_tflops_are_named():
    with pytest.raises(ConfigError, match="field 'bandwidth_bytes_per_s'"):
        parse_catalogue({"gpus": [_record(bandwidth_bytes_per_s="3.35e12")]}, "t.yaml")
    with pytest.raises(ConfigError, match="field 'fp16_tflops'"):
        parse_catalogue({"gpus": [_record(fp16_tflops=-1)]}, "t.yaml")


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match="field 'memory_byte' is not a known field"):
        parse_catalogue({"gpus": [_record(memory_byte=1)]}, "t.yaml")


def test_duplicate_alias_across_gpus_is_an_error():
    # "X-1" normalises to "x1", which the first GPU already uses
    second = _record(name="Y2-16GB", aliases=["X-1"])
    with pytest.raises(ConfigError, match=r"gpus\[1\] \(Y2-16GB\): field 'aliases' duplicate alias 'X-1'.*X1-16GB"):
        parse_catalogue({"gpus": [_record(), second]}, "t.yaml")


def test_top_level_shape_is_checked():
    with pytest.raises(ConfigError, match="top-level 'gpus' list"):
        parse_catalogue([_record()], "t.yaml")
    with pytest.raises(ConfigError, match=r"gpus\[0\]: expected a mapping"):
        parse_catalogue({"gpus": ["H100"]}, "t.yaml")


@pytest.mark.parametrize("typo,first", [("H1OO", "H100-SXM-80GB"), ("a1OO", "A100-SXM-80GB"), ("hl00", "H100-SXM-80GB"),
                                        ("mi3OOx", "MI300X-192GB"), ("rtx409", "RTX-4090-24GB")])
def test_the_closest_gpu_to_a_typo_comes_first(typo, first):
    with pytest.raises(GpuNotFoundError) as err:
        find_gpu(typo)
    assert err.value.hint.startswith(f"closest: {first}"), err.value.hint
