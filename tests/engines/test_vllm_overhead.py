"""vLLM V0's non-torch memory at tp >= 2 (kvplan.engines.vllm_overhead): the communicators made after the
profiler's baseline, by board, against the mechanism read in 0.6.6 / 0.7.2 / 0.7.3."""

from __future__ import annotations

import pytest

from kvplan.engines import Device
from kvplan.engines.vllm_overhead import (
    CUSTOM_ALLREDUCE_BYTES,
    NCCL_CHANNEL_BYTES,
    NCCL_PEER_BYTES,
    NVLS_BYTES_PER_RANK,
    non_torch,
    v0_custom_allreduce_bytes,
    v0_pipeline_bytes,
)
from kvplan.engines.vllm_releases import NON_TORCH_BYTES, profile
from kvplan.units import MiB

V0_RELEASES = ("0.6", "0.6.4", "0.6.5", "0.7.1", "0.7.2")


@pytest.mark.parametrize("version", V0_RELEASES)
def test_v0_custom_allreduce_follows_custom_all_reduce_py(version):
    p = profile(version)
    cuda = {board: Device("cuda", 108, board, "8.0") for board in ("nvlink-switch", "nvlink", "pcie")}
    for tp in (2, 4, 6, 8):
        assert non_torch(p, tp, cuda["nvlink"]).custom_allreduce == CUSTOM_ALLREDUCE_BYTES
        assert non_torch(p, tp, cuda["nvlink-switch"]).custom_allreduce == CUSTOM_ALLREDUCE_BYTES
        # more than two PCIe-only GPUs: off
        assert non_torch(p, tp, cuda["pcie"]).custom_allreduce == (CUSTOM_ALLREDUCE_BYTES if tp == 2 else 0)
    for tp in (3, 5, 16):  # not in _SUPPORTED_WORLD_SIZES, or the group spans nodes
        assert non_torch(p, tp, cuda["nvlink"]).custom_allreduce == 0
    rocm = Device("rocm", 304, "infinity-fabric")
    assert non_torch(p, 8, rocm).custom_allreduce == 0  # ParallelConfig: "not supported on AMD GPUs"
    assert v0_custom_allreduce_bytes(2, Device("cuda", 128, None)) == CUSTOM_ALLREDUCE_BYTES  # unknown = nvlink


def test_v1_keeps_its_custom_allreduce_rule():
    # V1 0.8 - 0.10 is not changed by the V0 rule: 3 GPUs over NVLink still charge the buffers there
    assert non_torch(profile("0.9.1"), 3, Device("cuda", 132, "nvlink", "9.0")).custom_allreduce == CUSTOM_ALLREDUCE_BYTES
    assert non_torch(profile("0.9.1"), 2, Device("cuda", 132, "nvlink", "9.0"), pp=2).pipeline == 0


def test_v0_pipeline_communicator():
    p = profile("0.7.2")
    nvlink = Device("cuda", 108, "nvlink", "8.0")
    assert non_torch(p, 8, nvlink).pipeline == 0
    # 2 x 8 GPUs (tp 8 in a node, pp 2 across): two ring peers on other nodes, the board's 2-rank channel figure
    across = non_torch(p, 8, nvlink, pp=2)
    assert across.pipeline == NCCL_CHANNEL_BYTES["nvlink"]
    assert across.bytes == non_torch(p, 8, nvlink).bytes + across.pipeline
    assert dict(across.parts())["pp NCCL communicator"] == across.pipeline
    # tp 2 x pp 4 on one NVSwitch node: a communicator of 4 ranks, its NVLS buffers included
    switch = Device("cuda", 132, "nvlink-switch", "9.0")
    one_node = non_torch(p, 2, switch, pp=4)
    assert one_node.pipeline == NCCL_CHANNEL_BYTES["nvlink-switch"] + 2 * NCCL_PEER_BYTES["nvlink-switch"] \
        + 4 * NVLS_BYTES_PER_RANK
    # pp alone (tp 1): the pp group's communicator is charged, no tp communicator
    solo = non_torch(p, 1, Device("cuda", 58, "pcie", "8.9"), pp=2)
    assert (solo.channels, solo.pipeline) == (0, NCCL_CHANNEL_BYTES["pcie"])
    assert v0_pipeline_bytes(4, 1, "nvlink") == 0


def test_the_pool_s_fullest_rank_holds_one_send_buffer_per_channel_more_than_rank_0():
    """vLLM sizes the pool by the worker with the fewest blocks; above 2 ranks of one node on NVLink-class boards that
    is a middle rank of NCCL's chain, which holds one send connection per channel more than rank 0 (whose lines a
    log prints): 24 channels x 2 MiB per communicator on Hopper, x 6 MiB on A100s (P2P read), per counted
    communicator; none at 2 ranks, over PCIe, on ROCm (RCCL's xGMI figure is its fullest rank's already)."""
    from kvplan.engines.vllm_overhead import fullest_rank_bytes

    hopper, a100 = Device("cuda", 132, "nvlink-switch", "9.0"), Device("cuda", 108, "nvlink", "8.0")
    assert fullest_rank_bytes(8, hopper) == 48 * MiB and fullest_rank_bytes(4, a100) == 144 * MiB
    assert fullest_rank_bytes(16, hopper) == 48 * MiB  # one node's chain: the same above 8 GPUs
    assert fullest_rank_bytes(8, Device("cuda", 148, "nvlink-switch", "10.0")) == 32 * 2 * MiB  # B200: 32 channels
    assert fullest_rank_bytes(2, hopper) == 0 == fullest_rank_bytes(8, Device("cuda", 142, "pcie", "8.9"))
    assert fullest_rank_bytes(8, Device("rocm", 304, "infinity-fabric", "9.4")) == 0
    assert non_torch(profile("0.7.1"), 8, a100).fullest_rank == 2 * 144 * MiB  # V0 counts two communicators
    assert non_torch(profile("0.19.0"), 8, hopper).fullest_rank == 48 * MiB  # 0.11+: torch.distributed's alone


def test_v0_totals_against_the_logs_that_print_them():
    """The V0 starts of the corpus that print non-torch memory at tp >= 2 (GiB per GPU; the rotary table aside):
    each stays within the tp-1 allowance's excess over the logged tp-1 median (0.30 - 0.10 GiB) plus NVLS and
    the per-peer fit's stated uncertainty of +-0.05 GiB a peer."""
    gib = 1 << 30
    cases = [  # (release, tp, pp, device, logged, tolerance)
        ("0.7.2", 2, 1, Device("cuda", 128, "pcie", "8.9"), 0.25, 0.20),  # vllm-13061, 2 x RTX 4090 (calibration)
        ("0.7.1", 2, 1, Device("cuda", 142, "pcie", "8.9"), 0.30, 0.20),  # vllm-15815, 2 x L40S
        ("0.7.1", 8, 1, Device("cuda", 108, "nvlink", "8.0"), 2.10, 0.05),  # vllm-f3706561278 (calibration)
        ("0.7.2", 4, 1, Device("cuda", 108, "nvlink", "8.0"), 1.39, 0.20),  # vllm-f12053131581, 4 x A100
        ("0.7.2", 8, 2, Device("cuda", 78, None, "9.0"), 2.53, 0.10),  # vllm-13074, 2 x 8 H20-3e (board unknown)
        # vllm-f54553382182, 8 x L40S at 0.6.6 ("custom allreduce is disabled ... more than two PCIe-only GPUs"; not
        # planned: InternVL3-78B is not bundled)
        ("0.6.5", 8, 1, Device("cuda", 142, "pcie", "8.9"), 0.36, 0.10),
    ]
    for version, tp, pp, device, logged, tolerance in cases:
        nt = non_torch(profile(version), tp, device, pp)
        planned = (nt.bytes - nt.fullest_rank) / gib  # rank 0's, whose lines the logs print
        assert abs(planned - logged) <= tolerance, (version, tp, pp, device.interconnect, planned, logged)
        assert planned >= logged - 0.05  # never far on the side that promises more KV
    assert NON_TORCH_BYTES / gib == pytest.approx(0.30)


def test_rccl_over_infinity_fabric_above_two_ranks():
    """RCCL's communicator over xGMI above 2 ranks is the calibrated RCCL figure (one, not growing with the ranks),
    shared with SGLang's pre-load rule; at 2 ranks the NVLink-class rule stands, so V1's tp-2 MI300X starts keep
    their plan; V0 at tp 8 on ROCm holds two such communicators and no custom all-reduce."""
    from kvplan.engines import sglang_overhead
    from kvplan.engines.vllm_overhead import RCCL_XGMI_WIDE_BYTES, nccl_communicator_bytes

    for tp in (4, 8, 16):
        assert nccl_communicator_bytes(tp, "infinity-fabric") == (RCCL_XGMI_WIDE_BYTES, 0)
    assert nccl_communicator_bytes(2, "infinity-fabric") == nccl_communicator_bytes(2, "nvlink")
    assert sglang_overhead.communicator_bytes(8, "infinity-fabric") == RCCL_XGMI_WIDE_BYTES
    # NVIDIA boards keep their rule: NVLink at tp 8 is far below the xGMI figure
    assert sum(nccl_communicator_bytes(8, "nvlink")) < RCCL_XGMI_WIDE_BYTES / 3
    mi300x = Device("rocm", 304, "infinity-fabric")
    v0 = non_torch(profile("0.6"), 8, mi300x)
    assert (v0.counted, v0.channels, v0.nvls, v0.custom_allreduce) == (2, 2 * RCCL_XGMI_WIDE_BYTES, 0, 0)
    # V1 0.11+ counts torch.distributed's communicator alone (post-NCCL snapshot), and custom all-reduce not at all
    assert non_torch(profile("0.11"), 8, mi300x).channels == RCCL_XGMI_WIDE_BYTES
    # the one vLLM V0 MI300X tp-8 log that isolates it (Llama-2-7B, hipBLASLt off: 3.34 GiB above the NVLink rule,
    # validation) is not over-promised: the rule adds at least that much
    nvlink_rule = 2 * sum(nccl_communicator_bytes(8, "nvlink"))
    assert v0.channels - nvlink_rule >= 3.34 * (1 << 30)


def test_v0_free_delta_reserves_one_hidden_block_behind_the_nccl_all_reduce():
    """0.6.0 - 0.6.3 charge the allocator's reserved memory: at tp >= 2 the hidden-sized block a layer all-reduced
    through torch.distributed stays reserved at the MLP's peak (tokens x hidden x 2 B); not at tp 1, not from 0.6.4
    (the allocated peak), not where custom all-reduce takes the tensor (CUDA, under 8 MiB)."""
    import kvplan
    from kvplan.engines.vllm_overhead import V0_CUSTOM_ALLREDUCE_MAX_BYTES, deferred_allreduce_bytes

    spec = kvplan.estimate("meta-llama/Llama-3.1-405B", gpu="MI300X", tp=8, context=4096,
                           engine_version="0.6.3").spec
    mi300x, nvlink = Device("rocm", 304, "infinity-fabric"), Device("cuda", 108, "nvlink", "8.0")
    p = profile("0.6")
    assert deferred_allreduce_bytes(p, spec, 8, 131072, 2, mi300x) == 131072 * 16384 * 2 == 4 << 30
    assert deferred_allreduce_bytes(p, spec, 1, 131072, 2, mi300x) == 0
    assert deferred_allreduce_bytes(profile("0.6.5"), spec, 8, 131072, 2, mi300x) == 0
    assert deferred_allreduce_bytes(profile("0.11"), spec, 8, 131072, 2, mi300x) == 0
    small = V0_CUSTOM_ALLREDUCE_MAX_BYTES // (spec.hidden_size * 2) - 1  # under custom all-reduce's max size
    assert deferred_allreduce_bytes(p, spec, 8, small, 2, nvlink) == 0  # custom all-reduce takes it on CUDA
    assert deferred_allreduce_bytes(p, spec, 8, small, 2, mi300x) == small * spec.hidden_size * 2  # ROCm: NCCL
    # it is in the plan's activation term, and said so
    plan = kvplan.estimate("meta-llama/Llama-3.1-405B", gpu="MI300X", tp=8, context=131072, engine_version="0.6.3")
    v065 = kvplan.estimate("meta-llama/Llama-3.1-405B", gpu="MI300X", tp=8, context=131072, engine_version="0.6.5")
    assert "behind an NCCL all-reduce" in plan.budget.activation.source
    assert "behind an NCCL all-reduce" not in v065.budget.activation.source


@pytest.mark.parametrize("version", ("0.6.4", "0.8.5"))
def test_absolute_releases_charge_the_hip_context_on_rocm(version):
    # 0.6.4 and V1 0.8.0 - 0.9.0 charge every byte torch did not allocate: on ROCm that is the HIP context, the
    # runtime's figure SGLang's reading measures (one constant for both engines), not the CUDA one
    from kvplan.engines import sglang_overhead
    from kvplan.engines.vllm_overhead import CONTEXT_BYTES_BY_PLATFORM, CUDA_CONTEXT_BYTES, HIP_CONTEXT_BYTES

    p = profile(version)
    mi300x = Device("rocm", 304, "infinity-fabric")
    h100 = Device("cuda", 132, "nvlink-switch", "9.0")
    assert non_torch(p, 1, mi300x).context == HIP_CONTEXT_BYTES == CONTEXT_BYTES_BY_PLATFORM["rocm"]
    assert non_torch(p, 1, h100).context == CUDA_CONTEXT_BYTES < HIP_CONTEXT_BYTES
    assert non_torch(p, 1, mi300x).bytes - non_torch(p, 1, h100).bytes == HIP_CONTEXT_BYTES - CUDA_CONTEXT_BYTES
    assert sglang_overhead.CONTEXT_BYTES_BY_PLATFORM["rocm"] == HIP_CONTEXT_BYTES
    assert dict(non_torch(p, 1, mi300x).parts())["CUDA / HIP context"] == HIP_CONTEXT_BYTES


@pytest.mark.parametrize("version", ("0.6", "0.6.5", "0.7.2", "0.9.1", "0.11"))
def test_releases_measuring_an_increase_charge_no_context_on_either_platform(version):
    # the context exists before the profiler's first reading (free-delta, increase, post-nccl)
    p = profile(version)
    assert non_torch(p, 1, Device("rocm", 304, "infinity-fabric")).context == 0
    assert non_torch(p, 1, Device("cuda", 132, "nvlink-switch", "9.0")).context == 0


def test_every_vllm_plan_on_rocm_says_hipblaslts_memory_is_left_out():
    # hipBLASLt's loaded kernels are charged by V0's and V1's profilers alike; a given non-torch term says nothing
    import kvplan
    from kvplan.engines.vllm_overhead import ROCM_NON_TORCH_NOTE

    for version in ("0.6.3", "0.6.5", "0.11.0"):
        plan = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="MI300X", context=8192, engine_version=version)
        assert ROCM_NON_TORCH_NOTE in plan.notes, version
    assert ROCM_NON_TORCH_NOTE not in kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192).notes
    given = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="MI300X", context=8192, overhead_gib="2GiB")
    assert ROCM_NON_TORCH_NOTE not in given.notes
