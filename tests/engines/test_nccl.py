"""NCCL's communicator buffers from its code (kvplan/engines/nccl.py): the sizes by hand, the channel counts NCCL's
logs print, which NCCL each engine release runs, and the buffers against the logs that isolate a communicator."""

from __future__ import annotations

import pytest

from kvplan.engines import nccl, sglang_overhead
from kvplan.engines.vllm_overhead import nccl_communicator_bytes
from kvplan.units import GiB, MiB


def test_protocol_buffers_and_their_rounding_by_hand():
    assert nccl.LL_BUFFER_BYTES == 512 * 1024  # 8 lines x 512 threads x 8 steps x 16 B
    assert nccl.LL128_BUFFER_BYTES == 4_915_200  # 120 x 640 x 8 x 8 B = 4.6875 MiB
    # write mode (Hopper, PCIe): the header alone sent (2 MiB), LL + LL128 + Simple received (9.19 MiB -> 10 MiB)
    assert (nccl.send_bytes(False), nccl.recv_bytes(False)) == (2 * MiB, 10 * MiB)
    # read mode (A100 pairs): Simple moves to the sender, 4 MiB + header -> 6 MiB; LL + LL128 5.19 MiB -> 6 MiB
    assert (nccl.send_bytes(True), nccl.recv_bytes(True)) == (6 * MiB, 6 * MiB)
    assert nccl.p2p_read("8.0") and not nccl.p2p_read("9.0") and not nccl.p2p_read(None)


def test_connections_along_one_node_s_chain():
    assert nccl.connections(1, 0) == (0, 0)
    assert nccl.connections(2, 0) == nccl.connections(2, 1) == (1, 1)  # ring and tree reach the same peer
    assert [nccl.connections(8, i) for i in (0, 3, 7)] == [(1, 2), (2, 2), (2, 1)]
    # the middle ranks hold the same at any size above 2: the buffers do not grow with the ranks of one node
    assert nccl.channel_bytes(4, 1, 24, False) == nccl.channel_bytes(8, 4, 24, False) == 24 * 24 * MiB


@pytest.mark.parametrize(("capability", "nvlinks", "release", "channels"), [
    ("9.0", 18, (2, 26, 2), 24),  # H100 / H200 / H20: 6 x 60 GB/s of 370.8, duplicated to 12, post-set 24
    ("8.0", 12, (2, 21, 5), 24),  # HGX A100: 6 x 40 of 240 fills it, 12, 24 ("Channel 23/24", nccl-tests#100)
    ("9.0", 8, (2, 18, 1), 16),  # H800: 4 x 40 GB/s, doubled (4 is not above 4), 16 (nccl#892's log)
    ("7.5", 0, (2, 26, 2), None),  # an architecture whose speeds were not read
    ("10.0", 18, (2, 27, 3), 32),  # B200: sm100 speeds, 18 x 40 GB/s = 720: 8 x 90 fills it, 16, post-set 32
    ("10.3", 18, (2, 26, 2), 32),  # B300: every capability >= 10.0 takes the sm100 arrays
    ("10.0", 18, (2, 21, 5), 24),  # a release without them takes the sm90 ones (and SM90_NVLINK_BW's place)
])
def test_nvswitch_channels_as_nccl_logs_print_them(capability, nvlinks, release, channels):
    assert nccl.nvswitch_channels(capability, nvlinks, release) == channels


def test_max_channels_by_release():
    assert nccl.max_channels((2, 21, 5)) == 32 and nccl.max_channels((2, 26, 2)) == 64


def test_nvls_per_rank_by_release():
    """16 NVLS channels x 2 x (buffSize + memSize): 2.20 6 MiB, 2.21 3 MiB, 2.22+ 1 MiB; x 8 ranks 1.5 GiB, 0.75 GiB,
    0.25 GiB per communicator."""
    per_rank = {r: nccl.nvls_bytes_per_rank(r) for r in ((2, 18, 1), (2, 20, 5), (2, 21, 5), (2, 27, 3))}
    assert per_rank == {(2, 18, 1): 0, (2, 20, 5): 192 * MiB, (2, 21, 5): 96 * MiB, (2, 27, 3): 32 * MiB}
    assert 8 * per_rank[(2, 20, 5)] == 1.5 * GiB and 8 * per_rank[(2, 27, 3)] == GiB // 4


def test_connected_at_init_unless_cumem_and_2_22():
    assert nccl.connected_at_init((2, 21, 5), cumem=True)
    assert nccl.connected_at_init((2, 27, 3), cumem=False)  # vLLM and SGLang set NCCL_CUMEM_ENABLE=0
    assert not nccl.connected_at_init((2, 22, 3), cumem=True)


@pytest.mark.parametrize(("engine", "release", "expected"), [
    ("vllm", (0, 6, 3), (2, 20, 5)), ("vllm", (0, 6, 4), (2, 21, 5)), ("vllm", (0, 7, 3), (2, 21, 5)),
    ("vllm", (0, 8, 5), (2, 21, 5)), ("vllm", (0, 9, 0), (2, 26, 2)), ("vllm", (0, 10, 2), (2, 27, 3)),
    ("vllm", (0, 11, 1), (2, 27, 5)), ("vllm", (0, 17, 0), (2, 27, 5)), ("vllm", (0, 20, 0), (2, 28, 9)),
    ("vllm", (0, 5, 0), None),
    ("sglang", (0, 4, 8), (2, 26, 2)), ("sglang", (0, 5, 3), (2, 27, 3)), ("sglang", (0, 5, 8), (2, 27, 5)),
    ("sglang", (0, 5, 10), (2, 27, 5)), ("sglang", (0, 5, 11), (2, 28, 9)),
    ("sglang", (0, 4, 3), None),  # no torch pin of its own (vLLM's)
])
def test_engine_release_to_nccl(engine, release, expected):
    assert nccl.engine_nccl(engine, release) == expected


def test_validation_log_s_rank_spread_is_the_chain_s():
    """sglang-pr11716 (8 x H200, 0.5.3-era -> torch 2.8 -> NCCL 2.27.3) prints 1.77 - 2.01 GB over its ranks: the middle ranks'
    2 + 2 connections less the last rank's 2 + 1 x 24 channels, write mode: 24 x (24 - 14) MiB = 0.234 GiB."""
    (_, release, ranks, _, low, high), = nccl.VALIDATION
    channels = nccl.nvswitch_channels("9.0", 18, release)
    spread = (nccl.channel_bytes(ranks, 3, channels, False) - nccl.channel_bytes(ranks, ranks - 1, channels, False))
    assert spread / GiB == pytest.approx(high - low, abs=0.02)


def test_buffers_stay_below_every_logged_communicator_and_kvplan_s_rules():
    """The buffers are a floor: each log that isolates one communicator holds at least its ranks' buffers, and so
    do kvplan's calibrated rules (vLLM's per-board rule at tp 2 - 8; SGLang's at tp 4 - 8)."""
    for _, release, ranks, _, low, _ in nccl.CALIBRATION + nccl.VALIDATION:
        floor = nccl.buffers_gib(ranks, ranks - 1, "9.0", 18, release)  # the rank with the fewest connections
        assert floor <= low
    hopper = (2, 26, 2)
    for tp in (2, 4, 8):
        top = max(nccl.buffers_gib(tp, i, "9.0", 18, hopper) for i in range(tp))
        assert nccl_communicator_bytes(tp, "nvlink-switch")[0] / GiB >= top, tp
        if tp > 2:
            assert sglang_overhead.communicator_bytes(tp, "nvlink-switch") / GiB >= top


def test_the_two_sglang_nvswitch_logs_run_the_same_nccl():
    """sglang-k8sgrok2 (0.5.2rc2) and sglang-pr11716 (0.5.3-era) both pin torch 2.8.0: the same NCCL, so the 0.5 GiB
    between their communicators is not NCCL's release."""
    assert nccl.engine_nccl("sglang", (0, 5, 2)) == nccl.engine_nccl("sglang", (0, 5, 3)) == (2, 27, 3)
    assert {row[1] for row in nccl.CALIBRATION + nccl.VALIDATION} == {(2, 27, 3)}


def test_board_channels_by_architecture():
    """The NVSwitch board of each architecture read (HGX A100: 12 NVLinks, Hopper and Blackwell: 18): 24, 24, 32."""
    assert [nccl.board_channels(cc) for cc in ("8.0", "9.0", "10.0")] == [24, 24, 32]
    assert nccl.board_channels("8.9") is None and nccl.board_channels(None) is None  # no NVSwitch arrays read


def test_sglang_on_blackwell_holds_its_extra_channels_buffers():
    """SGLang's communicator rule is the 24-channel H100's; a B200 board runs 32 channels: 8 x (2 send x 2 MiB + 2
    receive x 10 MiB) = 192 MiB more on the fullest rank above 2 ranks, 8 x 12 MiB at 2; none on Hopper or PCIe."""
    assert sglang_overhead.more_channels_bytes(8, "10.0") == 192 * MiB
    assert sglang_overhead.more_channels_bytes(2, "10.0") == 96 * MiB
    assert sglang_overhead.more_channels_bytes(8, "9.0") == 0 == sglang_overhead.more_channels_bytes(8, None)
    b200, h100 = (sglang_overhead.communicator_bytes(4, "nvlink-switch", cc) for cc in ("10.0", "9.0"))
    assert b200 - h100 == 192 * MiB
    assert sglang_overhead.communicator_bytes(4, "pcie", "10.0") == sglang_overhead.NCCL_PCIE_BYTES


def test_nvls_per_gpu_rounds_up_to_the_multicast_granularity():
    """One communicator's NVLS buffer per GPU: per-rank size x the node's ranks (every rank a head), rounded up to
    512 MiB: 2.21 at 8 ranks 96 MiB x 8 = 768 -> 1 GiB, at 4 384 -> 512 MiB; 2.22+ 32 MiB x 8 = 256 -> 512 MiB;
    Blackwell's 24 channels 48 MiB x 8 = 384 -> 512 MiB; none at 2 ranks."""
    assert nccl.nvls_bytes((2, 21, 5), 8) == GiB and nccl.nvls_bytes((2, 21, 5), 4) == 512 * MiB
    assert nccl.nvls_bytes((2, 27, 3), 8) == 512 * MiB == nccl.nvls_bytes((2, 27, 3), 8, "10.0")
    assert nccl.nvls_bytes((2, 20, 5), 8) == 1536 * MiB and nccl.nvls_bytes((2, 27, 3), 2) == 0


def test_a_middle_rank_holds_one_send_buffer_per_channel_more_than_the_first():
    assert nccl.fullest_over_first_bytes(8, 24, False) == 24 * nccl.send_bytes(False) == 48 * MiB
    assert nccl.fullest_over_first_bytes(3, 24, True) == 24 * 6 * MiB  # A100s: P2P read puts Simple on the sender
    assert nccl.fullest_over_first_bytes(2, 24, False) == 0  # both ranks 1 + 1
