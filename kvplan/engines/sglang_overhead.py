"""SGLang's memory in use before its weights load, per GPU (bytes), from the mechanism: what exists when
``ModelRunner`` takes its first reading of the free memory.

Read in the sglang wheels 0.4.3.post4, 0.4.6.post5, 0.4.10, 0.5.2, 0.5.3 and 0.5.8 (``ModelRunner.init_torch_distributed``,
``parallel_state.init_distributed_environment`` / ``initialize_model_parallel`` / ``GroupCoordinator``,
``dp_attention.initialize_dp_attention``, ``device_communicators/custom_all_reduce.py``,
``entrypoints/engine._set_envs_and_config``). The reading ("Load weight begin. avail mem") comes after:

- the CUDA / HIP context (``set_device`` and the first ``mem_get_info``): :data:`CONTEXT_BYTES_BY_PLATFORM`;
- one PyNccl communicator per model-parallel group of more than one rank: the tensor-parallel group's (``tp``
  ranks) and, at ``pp >= 2``, the pipeline group's (``pp`` ranks). The world group has no PyNccl
  (``init_world_group``: ``use_pynccl=False``); the MoE groups are the TP group or groups of one rank at
  ``ep_size`` 1; the attention-TP group of ``initialize_dp_attention`` has PyNccl only with
  ``SYNC_TOKEN_IDS_ACROSS_TP`` (off; from 0.5.8 also with NSA prefill context parallelism); torch.distributed's
  own NCCL groups are created lazily (``init_process_group`` gets no ``device_id``). PyNccl's warm-up all-reduce
  makes NCCL allocate its ring / tree channel buffers (:func:`communicator_bytes`): above 2 ranks and on PCIe the size
  SGLang's own dist-init line prints (:data:`NCCL_WIDE_BYTES`, :data:`NCCL_PCIE_BYTES`), at 2 NVLink ranks vLLM's
  calibrated size of the same NCCL code (:func:`kvplan.engines.vllm_overhead.nccl_communicator_bytes`). No NVLS
  buffers: every release sets ``NCCL_NVLS_ENABLE=0`` unless ``--enable-nccl-nvls`` (0.5.2+ also leaves it to
  ``--enable-symm-mem``, 0.5.8+ to the environment), and ``NCCL_CUMEM_ENABLE=0`` unless ``--enable-symm-mem`` (cudaMalloc'd
  buffers, no cuMem granularity);
- SGLang's custom all-reduce on the TP group (on unless ``--disable-custom-all-reduce``): world sizes 2, 4, 6, 8, above
  2 GPUs only where every pair is NVLink / xGMI-connected (``is_full_nvlink``): an 8 MiB IPC buffer, an 8 MiB
  metadata + buffer and 8 MiB of rank data, the size :data:`kvplan.engines.vllm_overhead.CUSTOM_ALLREDUCE_BYTES`
  charges for vLLM's copy of the same code. mscclpp (``--enable-mscclpp``), torch symmetric memory
  (``--enable-torch-symm-mem``, 0.5.3+) and ROCm's quick all-reduce (``ROCM_QUICK_REDUCE_QUANTIZATION``, default
  ``NONE``) are off by default and not modelled.

0.3 - 0.4.6 at tp >= 2 then all-reduce the free memory's minimum on the default NCCL group, whose communicator NCCL
creates after this rank's reading (:func:`late_comm_bytes`).
"""

from __future__ import annotations

from kvplan.engines import Device, nccl
from kvplan.engines.sglang_releases import release
from kvplan.engines.vllm_overhead import (CUSTOM_ALLREDUCE_BYTES, HIP_CONTEXT_BYTES, RCCL_XGMI_WIDE_BYTES,
                                          nccl_communicator_bytes)
from kvplan.frozen import frozen
from kvplan.units import GiB

# The CUDA / HIP context, in use when SGLang takes its first reading (the total less the free memory before loading,
# less "Init torch distributed ends. mem usage"), calibration part: 0.40 GiB on an RTX 4090 (sglang-exp001-2x4090),
# 0.53 on an H100 SXM (sglang-k8sgrok2-8xh100), 0.23 on an L4 (sglang-llmsinclouds-4xl4): kvplan keeps 0.45 on CUDA;
# ROCm 0.80 (sglang-pr18263-mi355x, tp 1: "Load weight end" avail mem 230.20 + mem usage 56.98 GB of 287.98 GiB).
CONTEXT_BYTES = round(0.45 * GiB)
CONTEXT_BYTES_BY_PLATFORM = {"cuda": CONTEXT_BYTES, "rocm": HIP_CONTEXT_BYTES}
# One NCCL communicator as SGLang's "Init torch distributed ends. mem usage" prints it (less the custom all-reduce),
# calibration part. PyNccl's warm-up all-reduce connects each rank to its ring neighbours and tree parent / children
# only (no send / recv connection before loading), so above 2 ranks the buffers do not grow with the ranks: one figure
# per board, measured at tp 8 and taken for tp 4 - 16 alike:
# - NVLink-class boards: 1.23 GiB at tp 8 on H100 SXMs (sglang-k8sgrok2-8xh100, 0.5.2rc2: 1.25 - 0.02, rank 0's; the
#   fullest rank's below: + :data:`FULLEST_RANK_EXTRA_BYTES`); NVLink without
#   NVSwitch the same (NVLS is off on both); Infinity Fabric from the whole pre-load memory of one tp-8 MI355X log
#   (sglang-rocmcompat-mi355x-kimi-k25-tp8, 0.5.8.post1, ROCm, no dist line: 4.45 GiB in use on the fullest rank,
#   - 0.80 HIP context - 0.02 -> 3.63; RCCL on xGMI runs many more channels);
# - at 2 ranks on those boards no SGLang log prints it: vLLM's calibrated communicator (the same NCCL code,
#   :func:`~kvplan.engines.vllm_overhead.nccl_communicator_bytes`, its NVLS buffers left out), 0.41 GiB;
# - PCIe at any tp: 0.17 GiB at tp 2 on RTX 4090s (sglang-exp001, 0.19 - 0.02) and 0.13 at tp 4 on L4s
#   (sglang-llmsinclouds, custom all-reduce off); the median, 0.15 (vLLM's tp-2 figure is 0.05).
CALIBRATION_CHANNELS = nccl.board_channels("9.0")  # 8 x H100 SXM, NCCL 2.27.3 (torch 2.8): 24
# SGLang sizes its pool by the fullest rank (``get_available_gpu_memory(distributed=True)``: the least free memory of
# any rank), and the calibration log prints rank 0's, the first of one node's ring / tree chain: the middle ranks hold
# one more send connection per channel (:func:`kvplan.engines.nccl.connections`: 1 + 2 against 2 + 2), 24 channels x
# 2 MiB = 0.05 GiB on 8 x H100 with NCCL 2.27.3, as pr11716's ranks print it (TP0 1.96, the middle ranks 2.01 GB).
FULLEST_RANK_EXTRA_BYTES = nccl.fullest_over_first_bytes(8, CALIBRATION_CHANNELS, False)
NCCL_WIDE_BYTES = {"nvlink-switch": round(1.23 * GiB) + FULLEST_RANK_EXTRA_BYTES,
                   "nvlink": round(1.23 * GiB) + FULLEST_RANK_EXTRA_BYTES,
                   "infinity-fabric": RCCL_XGMI_WIDE_BYTES}  # 3.63 GiB, the fullest rank's (the figure lives with vLLM's NCCL rule)
NCCL_PCIE_BYTES = round(0.15 * GiB)
CUSTOM_ALLREDUCE_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES (0.3 - 0.5.x)
# Boards whose late communicator (0.3 - 0.4.6) holds device memory: on PCIe boards none
# (sglang-llmsinclouds-4xl4-qwq32b-tp4, 0.4.3, tp 4: the pool implies 21.63 GiB free at the first reading, as printed at
# "Load weight begin" after the communicator, to the print's 0.03 GiB; such boards often run NCCL's SHM transport, its
# buffers in host memory).
LATE_COMM_BOARDS = ("nvlink", "nvlink-switch", "infinity-fabric")
DEFAULT_INTERCONNECT = "nvlink"  # a GPU given by its memory alone


@frozen
class PreLoad:
    """What is in use per GPU when SGLang takes its first reading (bytes), as named parts."""

    context: int  # the CUDA / HIP context
    communicators: int  # the PyNccl communicators' NCCL channel buffers (TP group, PP group)
    custom_allreduce: int  # SGLang's custom all-reduce IPC buffers on the TP group
    interconnect: str
    groups: tuple[int, ...] = ()  # the ranks of each group with a PyNccl communicator

    @property
    def bytes(self) -> int:
        return self.context + self.communicators + self.custom_allreduce

    def parts(self) -> tuple[tuple[str, int], ...]:
        """The non-zero parts as ``(name, bytes)``, in the order SGLang makes them."""
        named = (("GPU context", self.context),
                 (f"NCCL ({' + '.join(f'{n} ranks' for n in self.groups)} over {self.interconnect})", self.communicators),
                 ("custom all-reduce", self.custom_allreduce))
        return tuple((name, size) for name, size in named if size)


def _interconnect(device: Device | None) -> str:
    return (device.interconnect if device else None) or DEFAULT_INTERCONNECT


def more_channels_bytes(ranks: int, capability: str | None) -> int:
    """What the fullest rank of one communicator holds above the calibration board's (8 x H100, 24 NCCL channels)
    on an NVLink-class board whose NCCL runs more channels (bytes per GPU; 0 for as many or fewer, or an architecture
    not read): Blackwell's sm100 ring search gives 32 (:func:`kvplan.engines.nccl.board_channels`), 8 channels x
    the rank's connections more - 8 x 24 MiB = 192 MiB above 2 ranks, 8 x 12 MiB at 2."""
    channels = nccl.board_channels(capability)
    if ranks < 2 or channels is None or channels <= CALIBRATION_CHANNELS:
        return 0
    local, read = min(ranks, 8), nccl.p2p_read(capability)
    position = 1 if local > 2 else 0  # a middle rank of the chain: the fullest
    return (nccl.channel_bytes(local, position, channels, read)
            - nccl.channel_bytes(local, position, CALIBRATION_CHANNELS, read))


def communicator_bytes(ranks: int, interconnect: str, capability: str | None = None) -> int:
    """One NCCL communicator over ``ranks`` GPUs as SGLang's logs show it (bytes per GPU; 0 below 2 ranks): on PCIe
    :data:`NCCL_PCIE_BYTES`; on NVLink-class boards (unknown: ``nvlink``) at 2 ranks the channel buffers of
    :func:`~kvplan.engines.vllm_overhead.nccl_communicator_bytes` (no NVLS: SGLang keeps it off), above 2 ranks
    :data:`NCCL_WIDE_BYTES`; on NVLink / NVSwitch boards whose GPUs of compute capability ``capability`` run more
    NCCL channels than the calibration H100s, their buffers too (:func:`more_channels_bytes`)."""
    if ranks < 2:
        return 0
    if interconnect == "pcie":
        return NCCL_PCIE_BYTES
    more = more_channels_bytes(ranks, capability) if interconnect in ("nvlink-switch", "nvlink") else 0
    if ranks == 2:
        return nccl_communicator_bytes(2, interconnect)[0] + more
    return NCCL_WIDE_BYTES.get(interconnect, NCCL_WIDE_BYTES[DEFAULT_INTERCONNECT]) + more


def custom_allreduce_on(tp: int, interconnect: str) -> bool:
    """Whether SGLang's custom all-reduce holds its buffers at ``tp``: a supported world size, and above 2 GPUs every
    pair NVLink- (or xGMI-) connected (PCIe boards: only at tp 2, where its P2P check is not known: charged)."""
    return tp in CUSTOM_ALLREDUCE_WORLD_SIZES and (tp == 2 or interconnect != "pcie")


def pre_load(tp: int, pp: int = 1, device: Device | None = None) -> PreLoad:
    """The memory in use per GPU when SGLang takes its first reading (:class:`PreLoad`), for ``tp`` x ``pp`` ranks on
    ``device``'s board (unknown: ``nvlink``)."""
    interconnect = _interconnect(device)
    groups = tuple(n for n in (tp, pp) if n >= 2)
    capability = device.compute_capability if device else None
    comms = sum(communicator_bytes(n, interconnect, capability) for n in groups)
    custom = CUSTOM_ALLREDUCE_BYTES if custom_allreduce_on(tp, interconnect) else 0
    context = CONTEXT_BYTES_BY_PLATFORM.get(device.platform if device else "cuda", CONTEXT_BYTES)
    return PreLoad(context, comms, custom, interconnect, groups)


def pre_load_bytes(tp: int, pp: int = 1, device: Device | None = None) -> int:
    """:func:`pre_load`'s total, bytes per GPU."""
    return pre_load(tp, pp, device).bytes


def late_comm_bytes(version: str, tp: int, pp: int = 1, device: Device | None = None) -> int:
    """The NCCL communicator a release of :attr:`~kvplan.engines.sglang_releases.Release.min_on_nccl` creates after
    its first reading (bytes per GPU, charged in full): the default group's, over ``tp x pp`` ranks
    (:func:`communicator_bytes`), on NVLink / NVSwitch / Infinity Fabric boards (unknown: ``nvlink``); 0 on PCIe, at
    tp 1 and in 0.4.7+."""
    interconnect = _interconnect(device)
    if tp < 2 or not release(version).min_on_nccl or interconnect not in LATE_COMM_BOARDS:
        return 0
    return communicator_bytes(tp * pp, interconnect, device.compute_capability if device else None)
