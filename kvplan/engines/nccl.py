"""NCCL's device memory per communicator, from NCCL's own code, and which NCCL each engine release runs.

Read in NVIDIA/nccl at v2.21.5-1, v2.26.2-1 and v2.27.3-1 (the three releases the engines in the corpus run; the
rules quoted below are the same in all three unless a release is named):

- **Buffers per connection** (``src/init.cc`` ``DEFAULT_*_BUFFSIZE``, ``src/include/device.h``): LL 8 lines x 512
  threads x 8 steps x 16 B = 512 KiB, LL128 120 x 640 x 8 x 8 B = 4.6875 MiB, Simple 4 MiB (``NCCL_BUFFSIZE``). The
  P2P transport (``src/transport/p2p.cc``, ``p2pSendSetup`` / ``p2pRecvSetup``) puts all three in the receiver's
  buffer, or with P2P read the Simple one in the sender's, each side's size rounded up to ``CUDA_IPC_MIN`` (2 MiB):
  write mode 2 MiB sent + 10 MiB received, read mode 6 + 6 MiB. Read is on only between two compute-capability-8.0
  GPUs over NVLink (``graph/paths.cc`` ``ncclTopoCheckP2p``): A100s, not Hopper. With ``NCCL_CUMEM_ENABLE=0`` (vLLM
  sets it in ``env_override.py`` / ``__init__.py``; SGLang unless ``--enable-symm-mem``) they are ``cudaMalloc``'d.
- **What is connected at init** (``init.cc`` ``initTransportsRank``): ``runtimeConn = cuMemSupport &&
  NCCL_RUNTIME_CONNECT`` (2.22+). With cuMem off - both engines - NCCL connects every ring and tree channel (and the
  NVLS buffers where NVLS is on) when the communicator is made, in every release; only with cuMem on (2.22+) does
  it wait for the first collective and connect just the algorithm that collective uses. Ring and tree connections
  to the same peer on the same channel are made once (``ncclTransportP2pConnect``'s per-peer channel masks). On
  one node the tree is a chain in the ring's order (``graph/connect.cc`` ``ncclTopoPreset``: ``tree.up`` the
  previous GPU, ``tree.down[0]`` the next), so per channel the first rank of the chain holds 1 send + 2 receive
  connections, the middle ranks 2 + 2, the last 2 + 1; at 2 ranks each holds 1 + 1 (:func:`connections`).
- **Channels on an NVSwitch board** (``graph/search.cc`` ``ncclTopoCompute`` / ``ncclTopoDupChannels``,
  ``graph/connect.cc`` ``ncclTopoPostset``): the ring search takes the fastest speed of the architecture's list
  whose channels fill the GPU's NVLink bandwidth best, doubles the channels (halving the speed) at >= 25 GB/s
  unless Hopper+ below 50 GB/s with more than 4 channels, and the post-set doubles them again (at most
  ``MAXCHANNELS``): :func:`nvswitch_channels` - 24 on 8 x H100 / H200 / H20 (18 NVLinks of 20.6 GB/s) and on
  8 x A100 (12 x 20), 16 on H800 (8 links), as NCCL's own logs print them ("Channel 23/24" on HGX A100,
  "16 coll channels" on H800: nccl-tests#100, nccl#892).
- **NVLS** (``transport/nvls.cc`` ``ncclNvlsSetup`` / ``ncclNvlsBufferSetup``): off at 2 GPUs and when
  ``NCCL_NVLS_ENABLE=0`` (SGLang's default); per rank ``nChannels x 2 x (buffSize + memSize)``:
  :func:`nvls_bytes_per_rank`.

What these rules do not give is the rest of a communicator's footprint: the SGLang logs charge more than the
buffers (:data:`CALIBRATION`, :data:`VALIDATION`; the kernels NCCL loads at init, their local memory and NCCL's
device-side structures are not in the source as sizes), and by different amounts at the same NCCL release. kvplan's engine rules keep their calibrated figures; this module is the mechanism they
are checked against (tests/engines/test_nccl.py).

May import: kvplan.units
"""

from __future__ import annotations

from kvplan.units import GiB, MiB

NCCL_STEPS = 8
LL_BUFFER_BYTES = 8 * 512 * NCCL_STEPS * 16  # NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x steps x 16 B line
LL128_BUFFER_BYTES = 120 * 640 * NCCL_STEPS * 8  # NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x steps x 8 B
SIMPLE_BUFFER_BYTES = 4 * MiB  # DEFAULT_BUFFSIZE (NCCL_BUFFSIZE)
CUDA_IPC_MIN_BYTES = 2 * MiB  # CUDA_IPC_MIN: each P2P side's buffer is rounded up to it
# sizeof(ncclSendMem) / sizeof(ncclRecvMem): headers far below 2 MiB; any positive size rounds to the same bytes.
CONNECTION_HEADER_BYTES = 4096

# torch's pin of nvidia-nccl-cu12 (x86_64 Linux wheels' METADATA, Requires-Dist; read in 2.1.2, 2.2.0, 2.3.0, 2.3.1,
# 2.4.0, 2.4.1, 2.5.0, 2.5.1, 2.6.0, 2.7.0, 2.7.1, 2.8.0, 2.9.0, 2.9.1, 2.10.0; 2.11.0 pins nvidia-nccl-cu13), by torch
# (major, minor).
TORCH_NCCL = {(2, 1): (2, 18, 1), (2, 2): (2, 19, 3), (2, 3): (2, 20, 5), (2, 4): (2, 20, 5), (2, 5): (2, 21, 5),
              (2, 6): (2, 21, 5), (2, 7): (2, 26, 2), (2, 8): (2, 27, 3), (2, 9): (2, 27, 5), (2, 10): (2, 27, 5),
              (2, 11): (2, 28, 9)}
# Each engine's torch pin from the first release that pins it (wheels' METADATA: vLLM ``torch==``; SGLang's ``srt``
# extra, 0.5+ its base requirements). Read in vLLM 0.5.5, 0.6.0 - 0.6.4, 0.6.6, 0.7.1 - 0.7.3, 0.8.0, 0.8.5, 0.9.0,
# 0.9.2, 0.10.0 - 0.10.2, 0.11.0 - 0.11.2, 0.12.0 - 0.20.0 (each minor's .0, and 0.19.1), and SGLang 0.4.0 - 0.4.10,
# 0.5.0rc2, 0.5.1 - 0.5.14; each boundary lies between two adjacent releases read. SGLang 0.4.0 - 0.4.3 pin no torch
# (they take vLLM's: 0.4.3 ``vllm<=0.7.2,>=0.6.4.post1``, torch 2.5); 0.4.4 - 0.4.5 pin 2.5.1. Releases after the last
# read (vLLM 0.20, SGLang 0.5.14) are assumed to keep its torch.
ENGINE_TORCH = {
    "vllm": (((0, 5, 5), (2, 4)), ((0, 6, 4), (2, 5)), ((0, 8, 0), (2, 6)), ((0, 9, 0), (2, 7)),
             ((0, 10, 2), (2, 8)), ((0, 11, 1), (2, 9)), ((0, 17, 0), (2, 10)), ((0, 20, 0), (2, 11))),
    "sglang": (((0, 4, 4), (2, 5)), ((0, 4, 6), (2, 6)), ((0, 4, 7), (2, 7)), ((0, 5, 0), (2, 8)), ((0, 5, 6), (2, 9)),
               ((0, 5, 11), (2, 11))),
}

# Ring search speeds (GB/s) and one NVLink's bandwidth by architecture (graph/search.cc *SpeedArrayIntra,
# graph/topo.h SM*_NVLINK_BW; NCCL takes the sm100 ones for every compute capability >= 10.0 - B200, B300 - and the
# sm90 ones from 9.0); MAXCHANNELS 32 before 2.26 (2.21.5), 64 from it (2.26.2, 2.27.3). 2.21.5 has no sm100 arrays
# (Blackwell needs a later NCCL); 2.26.2's sm100 list lacks 2.27.3's last speed (18.0), which no NVSwitch board reaches.
SPEEDS_INTRA = {80: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                100: (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}
NVLINK_GBPS = {80: 20.0, 90: 20.6, 100: 40.0}
# NVLinks per GPU of the NVSwitch boards by architecture: HGX A100 12, HGX H100 / H200 / H20 and HGX B200 / B300 18
# (H800's 8 are not told apart by the compute capability: planned as 18, more channels, the safe side).
BOARD_NVLINKS = {80: 12, 90: 18, 100: 18}
CALIBRATION_NCCL = (2, 27, 3)  # the NCCL the SGLang calibration logs run (torch 2.8)
SM100_FROM = (2, 26, 0)  # the first release read with the sm100 arrays (2.26.2; 2.21.5 has none)
MAX_CHANNELS_FROM = ((2, 26, 0), 64)
MAX_CHANNELS_BEFORE = 32

# NVLS (transport/nvls.cc): per channel and head, 2 x (buffSize + memSize). buffSize is the Simple buffer in
# 2.19 - 2.20, nvlsStepSize (128 KiB) x NCCL_STEPS from 2.21; memSize NVLS_MEM_ALIGN_SIZE (2 MiB) until 2.22, none
# after.
NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS' default on Hopper (NVLS_NCHANNELS_SM90 from 2.22)
NVLS_CHANNELS_SM100 = 24  # Blackwell on one node (NVLS_NCHANNELS_SM100_NVL, 2.27.3; 32 across nodes)
# cuMulticastGetGranularity(CU_MULTICAST_GRANULARITY_RECOMMENDED): what nvlsAllocateMem rounds one communicator's
# NVLS buffer up to (512 MiB on NVSwitch boards, as FlashInfer's multicast workspaces show)
NVLS_MULTICAST_GRANULARITY_BYTES = 512 * MiB
NVLS_STEP_BYTES = 128 * 1024
NVLS_MEM_ALIGN_BYTES = 2 * MiB

# Logs that isolate one NCCL communicator (GiB per GPU, NCCL's part only: SGLang's "Init torch distributed ends. mem
# usage" less its 18 MiB custom all-reduce), with the NCCL their engine runs: (log, NCCL, GPUs, board, GiB min-max).
# Both run torch 2.8.0, hence NCCL 2.27.3 (k8sgrok2: the lmsysorg/sglang:v0.5.2rc2-cu126 image, sglang 0.5.2rc2 pins
# torch==2.8.0; pr11716: 0.5.3-era main, 0.5.3 pins torch==2.8.0): what differs between them is not NCCL's release.
CALIBRATION = (("sglang-k8sgrok2-8xh100-grok2-fp8-tp8", (2, 27, 3), 8, "H100", 1.25 - 0.02, 1.25 - 0.02),)
VALIDATION = (("sglang-pr11716-8xh200-llama33-70b-tp8-piecewise", (2, 27, 3), 8, "H200", 1.77 - 0.02, 2.01 - 0.02),)


def torch_nccl(torch: tuple[int, int]) -> tuple[int, int, int] | None:
    """The NCCL release torch ``(major, minor)`` pins (:data:`TORCH_NCCL`), None for one not read."""
    return TORCH_NCCL.get(torch)


def engine_torch(engine: str, release: tuple[int, int, int]) -> tuple[int, int] | None:
    """The torch ``(major, minor)`` an engine release pins (:data:`ENGINE_TORCH`), None before the first pin read.
    Releases after the last one read take its torch (an assumption: later releases move torch forward)."""
    found = None
    for first, torch in ENGINE_TORCH[engine]:
        if release >= first:
            found = torch
    return found


def engine_nccl(engine: str, release: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """The NCCL release an engine release runs with its pinned torch (x86_64 wheels), None where not known."""
    torch = engine_torch(engine, release)
    return torch_nccl(torch) if torch else None


def _rounded(size: int) -> int:
    return -(-size // CUDA_IPC_MIN_BYTES) * CUDA_IPC_MIN_BYTES


def send_bytes(read: bool) -> int:
    """One P2P send connection's device buffer (bytes): the header, plus the Simple buffer with P2P read."""
    return _rounded(CONNECTION_HEADER_BYTES + (SIMPLE_BUFFER_BYTES if read else 0))


def recv_bytes(read: bool) -> int:
    """One P2P receive connection's device buffer (bytes): LL + LL128 (+ Simple without P2P read) and the header."""
    protocols = LL_BUFFER_BYTES + LL128_BUFFER_BYTES + (0 if read else SIMPLE_BUFFER_BYTES)
    return _rounded(CONNECTION_HEADER_BYTES + protocols)


def p2p_read(capability: str | None) -> bool:
    """Whether NCCL uses P2P read between two such GPUs over NVLink: compute capability 8.0 only."""
    return capability == "8.0"


def connections(ranks: int, position: int) -> tuple[int, int]:
    """``(send, receive)`` P2P connections per channel of the rank at ``position`` (0 .. ranks - 1) of one node's
    ring / tree chain, ring and tree connected together: 2 ranks 1 + 1; first 1 + 2, middle 2 + 2, last 2 + 1."""
    if ranks < 2:
        return 0, 0
    if ranks == 2:
        return 1, 1
    if position == 0:
        return 1, 2
    return (2, 1) if position == ranks - 1 else (2, 2)


def channel_bytes(ranks: int, position: int, channels: int, read: bool) -> int:
    """The ring + tree buffers one rank holds once its communicator is connected (bytes): :func:`connections`
    x :func:`send_bytes` / :func:`recv_bytes` x ``channels``."""
    send, recv = connections(ranks, position)
    return channels * (send * send_bytes(read) + recv * recv_bytes(read))


def fullest_over_first_bytes(ranks: int, channels: int, read: bool) -> int:
    """How much more a middle rank of one node's chain holds than its first (bytes; 0 at 2 ranks or fewer, where
    both hold 1 + 1): :func:`channel_bytes` of 2 + 2 connections less 1 + 2 - one send buffer per channel."""
    local = min(ranks, 8)
    return channel_bytes(local, 1, channels, read) - channel_bytes(local, 0, channels, read) if local > 2 else 0


def max_channels(nccl: tuple[int, int, int]) -> int:
    """NCCL's MAXCHANNELS: 32 before 2.26, 64 from it."""
    return MAX_CHANNELS_FROM[1] if nccl >= MAX_CHANNELS_FROM[0] else MAX_CHANNELS_BEFORE


def _ring_search(speeds: tuple[float, ...], total: float, limit: int) -> tuple[int, float]:
    """The first pass of ncclTopoCompute on a uniform NVSwitch board: the speed whose channels carry the most
    bandwidth (ties keep the faster), trying slower ones while the next is above 0.49 of the best."""
    best = (0, 0.0)
    for speed in speeds:
        if speed > total:
            continue
        if best[0] and speed / best[1] <= 0.49:
            break
        n = min(int(total // speed), limit)
        if n * speed > best[0] * best[1]:
            best = (n, speed)
        if n * speed >= total:
            break
    return best


def _arch(capability: str | None) -> int:
    """The speed arrays' architecture for a compute capability (``ccMin >= 100`` -> 100, ``>= 90`` -> 90, 8.0 ->
    80; 0 for one with no NVSwitch arrays read, or unknown)."""
    major, _, minor = (capability or "0.0").partition(".")
    cc = int(major) * 10 + int(minor or 0) if major.isdigit() and (minor or "0").isdigit() else 0
    return 100 if cc >= 100 else 90 if cc >= 90 else 80 if cc == 80 else 0


def board_channels(capability: str | None, nccl: tuple[int, int, int] = CALIBRATION_NCCL) -> int | None:
    """:func:`nvswitch_channels` on the NVSwitch board of this architecture (:data:`BOARD_NVLINKS`): 24 on
    A100 / Hopper, 32 on Blackwell; None for an architecture not read."""
    arch = _arch(capability)
    return nvswitch_channels(capability, BOARD_NVLINKS[arch], nccl) if arch in BOARD_NVLINKS else None


def nvswitch_channels(capability: str, nvlinks: int, nccl: tuple[int, int, int]) -> int | None:
    """NCCL's ring / tree channels on an NVSwitch board whose GPUs have ``nvlinks`` NVLinks each (None for an
    architecture not read): the ring search (:func:`_ring_search`, at most MAXCHANNELS / 2), ncclTopoDupChannels,
    and ncclTopoPostset's doubling (at most :func:`max_channels`)."""
    arch = _arch(capability)
    if arch == 100 and nccl < SM100_FROM:  # a release without the sm100 arrays takes the sm90 ones
        arch = 90
    if arch not in SPEEDS_INTRA:  # 8.0 (A100), 9.x (Hopper) and 10.x+ (Blackwell): the arrays read
        return None
    limit = max_channels(nccl)
    n, speed = _ring_search(SPEEDS_INTRA[arch], nvlinks * NVLINK_GBPS[arch], limit // 2)
    if speed >= 25.0 and not (arch > 80 and speed < 50.0 and n > 4):
        n = min(2 * n, limit // 2)
    return min(2 * n, limit)


def nvls_bytes_per_rank(nccl: tuple[int, int, int], channels: int = NVLS_CHANNELS) -> int:
    """NVLS buffers per rank of the communicator (bytes, before the multicast granularity): ``channels x 2 x
    (buffSize + memSize)`` - 2.19 - 2.20 4 MiB + 2 MiB, 2.21 1 MiB + 2 MiB, 2.22+ 1 MiB (0 before 2.19: not read)."""
    if nccl < (2, 19, 0):
        return 0
    buff = SIMPLE_BUFFER_BYTES if nccl < (2, 21, 0) else NVLS_STEP_BYTES * NCCL_STEPS
    mem = NVLS_MEM_ALIGN_BYTES if nccl < (2, 22, 0) else 0
    return channels * 2 * (buff + mem)


def connected_at_init(nccl: tuple[int, int, int], cumem: bool) -> bool:
    """Whether NCCL connects the ring / tree channels (and NVLS) when the communicator is made: always before 2.22,
    and from 2.22 unless cuMem is on (``runtimeConn = cuMemSupport && NCCL_RUNTIME_CONNECT``)."""
    return nccl < (2, 22, 0) or not cumem


def buffers_gib(ranks: int, position: int, capability: str, nvlinks: int, nccl: tuple[int, int, int]) -> float:
    """:func:`channel_bytes` on an NVSwitch board in GiB (reports and tests)."""
    channels = nvswitch_channels(capability, nvlinks, nccl) or 0
    return channel_bytes(ranks, position, channels, p2p_read(capability)) / GiB


def nvls_bytes(nccl: tuple[int, int, int], ranks: int, capability: str | None = None) -> int:
    """One communicator's NVLS buffer per GPU on one node's ``ranks`` (bytes; 0 at 2 ranks or fewer, where NCCL leaves
    NVLS off): ncclNvlsBufferSetup's ``nvlsPerRankSize x nHeads`` (:func:`nvls_bytes_per_rank`, every rank a head),
    rounded up to the multicast granularity by nvlsAllocateMem (:data:`NVLS_MULTICAST_GRANULARITY_BYTES`): 0.5 GiB at
    4 or 8 Hopper or Blackwell ranks from 2.22, 1 GiB at 8 ranks with 2.21."""
    if ranks <= 2:
        return 0
    channels = NVLS_CHANNELS_SM100 if _arch(capability) == 100 else NVLS_CHANNELS
    grain = NVLS_MULTICAST_GRANULARITY_BYTES
    return -(-nvls_bytes_per_rank(nccl, channels) * ranks // grain) * grain
