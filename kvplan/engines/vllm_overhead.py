"""vLLM's memory outside the KV cache that no tensor of the model holds: non-torch memory (the CUDA context, cuBLAS
workspaces, NCCL's communicators, NVLS buffers, custom all-reduce, the all-reduce fusion workspace) and CUDA graphs,
per release, tp and board (bytes per GPU).
"""

from __future__ import annotations


from kvplan.engines import (
    Device,
    Features,
    Term,
    forward_parts,
    nccl,
)
from kvplan.engines.vllm_releases import DEFAULT_VERSION, PROFILES, Profile, on_v2_runner, profile
from kvplan.model.spec import ModelSpec
from kvplan.units import GiB, MiB, plural
from kvplan.frozen import frozen

# The CUDA context, which the "absolute" releases charge: 0.6.4 logs 0.15 - 0.47 GiB of non-torch memory in all
# at tp 1 (calibration part: vllm-10517, three GTX 1080 runs), so with the tp-1 increase above kvplan adds 0.15.
CUDA_CONTEXT_BYTES = round(0.15 * GiB)
# The HIP context, which the "absolute" releases charge on ROCm in place of the CUDA one (V0 0.6.4 and the
# 0.6.4.post2 - 0.6.5 dev builds whose "Memory profiling results: duration=..." line charges every byte torch did not
# allocate, worker.py determine_num_available_blocks: ``mem_get_info`` total - free - torch's allocated bytes after
# ``empty_cache``; V1 0.8.0 - 0.9.0). No calibration vLLM log on ROCm prints it; the figure is the HIP runtime's,
# measured where SGLang reads the free memory before loading (sglang-pr18263-mi355x, tp 1: 287.98 GiB total - 230.20
# avail - 56.98 weights = 0.80 GiB; kvplan.engines.sglang_overhead takes it from here). The validation part's MI300X
# SGLang start holds 0.65 there and its W7900 vLLM 0.6.4 start 0.44 in all (hipBLAS, no hipBLASLt on gfx1100): 0.80 is
# the safe side.
HIP_CONTEXT_BYTES = round(0.80 * GiB)
CONTEXT_BYTES_BY_PLATFORM = {"cuda": CUDA_CONTEXT_BYTES, "rocm": HIP_CONTEXT_BYTES}
# One NCCL communicator's buffers per GPU, by interconnect: channel buffers (NCCL's own sizes: 4 MiB per
# channel and peer for the Simple protocol, plus LL/LL128) and, on NVSwitch boards with more than 2 GPUs,
# NVLink SHARP (NVLS) multicast buffers, ``nvlsPerRankSize`` 288 MiB per rank in the communicator
# (vllm#9699: 8 x H200, ``nvlsTotalSize`` 2.25 GiB). The channel part is calibrated on the one machine
# whose tp 2 logs isolate one communicator (h100-k8s, 0.12: 0.13 -> 0.54 GiB); PCIe on two 24 GB GeForce
# logs (0.20 - 0.25 GiB at tp 2 with two communicators).
NCCL_CHANNEL_BYTES = {"nvlink-switch": round(0.41 * GiB), "nvlink": round(0.41 * GiB),
                      "infinity-fabric": round(0.41 * GiB), "pcie": round(0.05 * GiB)}
# NCCL sizes NVLS by release (transport/nvls.cc, ncclNvlsSetup: nChannels x 2 x (buffSize + memSize) x heads, one
# cuMemCreate rounded up to the multicast granularity): 2.19 - 2.20 (torch <= 2.4, vLLM <= 0.6.3) take buffSize =
# the Simple buffer, 4 MiB, + memSize 2 MiB; 2.21 (torch 2.5 - 2.6: vLLM 0.6.4 - 0.8.x) a 128 KiB chunk x 8 steps =
# 1 MiB + 2 MiB; 2.22+ 1 MiB and no memSize (kvplan.engines.nccl.nvls_bytes_per_rank). 2.22+ would connect it at first
# use only with cuMem on (runtimeConn = cuMemSupport && NCCL_RUNTIME_CONNECT); vLLM sets NCCL_CUMEM_ENABLE=0, so every
# release sets NVLS up with the communicator (kvplan.engines.nccl.connected_at_init). At 16 NVLS channels and 8
# ranks that is 1.5 GiB, 0.75 GiB (1 GiB rounded) and 0.25 GiB per communicator. kvplan keeps the 288 MiB per rank
# of vllm#9699 for V0 (V1 below): the one V0 NVSwitch log above 2 GPUs that prints non-torch memory
# (vllm-f20903468563, 8 x H200, 0.7.3: 7.16 GiB) charges more than the 2.21 reading leaves room for, so what it
# holds beyond the channels is not known, and a smaller NVLS figure would promise KV that log did not get.
NVLS_BYTES_PER_RANK = 288 * MiB
# V1 (0.8+) takes NCCL's own sizes instead (kvplan.engines.nccl.nvls_bytes, its release's NCCL from the torch pin):
# 1 GiB per communicator at 8 ranks with 2.21 (0.8.x), 0.5 GiB with 2.26+ (0.9+). Two calibration logs agree: 2 x 8
# H20 at tp 16 on 0.8 (vllm-17242, tokens, -12.0% -> -0.6%) and 8 x B200 at tp 8 on 0.13 (vllm-f56792279388, KV
# budget, -2.0% -> -0.8%); no V1 log of the corpus says more. The low end still pays what 288 MiB x tp would add
# (NonTorch.nvls_gap -> Budget.nvls_gap_bytes), the figure V0 is planned with.
# Each peer beyond the first adds buffers to a communicator over NVLink-class links (NVLink, NVSwitch, Infinity
# Fabric): NCCL connects P2P channels per peer (send/recv and the gather vLLM's logits use), each with its own
# Simple/LL/LL128 buffers, so the bytes grow with tp - 1. The size per peer is a fit, not read in NCCL (its ring + tree
# buffers alone stop growing at 3 ranks of one node, kvplan.engines.nccl.connections; what grows is not known): on the
# calibration part it takes the one tp-8 NVLink log that prints non-torch memory (vllm-f3706561278, 8 x A100 40GB,
# V0 0.7.1: 2.10 GiB with two communicators -> 0.89 GiB each, 0.41 at tp 2 + 6 x 0.08) with the tp-2 value above;
# uncertain to about +-0.05 GiB per peer (the validation part's tp-4 A100 log charges 1.39 GiB, this rule 1.50).
# PCIe boards keep the tp-2 figure (logs at tp 8 over PCIe charge 0.2 - 0.4 GiB in all). Only the peers of one node
# count (NVLINK_PEERS_PER_NODE: a node of 8 GPUs; peers on other nodes are reached over the network transport, not
# P2P; no calibration log prints non-torch memory above 8 GPUs, and vllm-17242, 2 x 8 H20 at tp 16, is already
# planned 28% under the KV it got).
NVLINK_PEERS_PER_NODE = 8
NCCL_PEER_BYTES = {"nvlink-switch": round(0.08 * GiB), "nvlink": round(0.08 * GiB),
                   "infinity-fabric": round(0.08 * GiB), "pcie": 0}
# The pool is the fullest rank's: V0's executor takes the least "# GPU blocks" of its workers (min over
# determine_num_available_blocks), V1 unifies the workers' KV configs to the least blocks (unify_kv_cache_configs /
# get_kv_cache_configs), and one node's NCCL ring / tree chain does not load every rank alike
# (:func:`kvplan.engines.nccl.connections`): rank 0, the chain's first, holds 1 send + 2 receive connections per
# channel, the middle ranks 2 + 2, so a middle rank holds one send buffer per channel and communicator more than rank 0,
# whose memory-profiling lines a log prints and the rules above were sized on (the tp-8 A100 log among them). Per
# communicator that is NCCL_NODE_CHANNELS x one send buffer: 24 x 2 MiB = 48 MiB on Hopper, 24 x 6 MiB = 144 MiB on
# A100s (P2P read puts the Simple buffer on the sender); SGLang's 8 x H200 log prints the chain's spread rank by rank
# (TP0 1.96, the middle ranks 2.01 GB: 48 MiB). Only NVLink-class NVIDIA boards above 2 ranks of one node: at 2 ranks
# both hold 1 + 1, PCIe boards run few channels, and RCCL's xGMI figure below is already its fullest rank's.
NCCL_NODE_CHANNELS = 24  # a GPU of unknown architecture: 8 x H100 / H200 / H20 and 8 x A100's (H800: 16)
FULLEST_RANK_BOARDS = ("nvlink-switch", "nvlink")


def fullest_rank_bytes(tp: int, device: Device) -> int:
    """How much more one NCCL communicator holds on the pool's fullest rank than on rank 0 (bytes per GPU): one send
    buffer per channel (the board's channels, :func:`kvplan.engines.nccl.board_channels` - 32 on Blackwell - else
    :data:`NCCL_NODE_CHANNELS`, x :func:`kvplan.engines.nccl.send_bytes`, P2P read on compute capability 8.0) above
    2 ranks of one node on :data:`FULLEST_RANK_BOARDS` with CUDA; else 0."""
    interconnect = device.interconnect or "nvlink"
    if min(tp, NVLINK_PEERS_PER_NODE) <= 2 or interconnect not in FULLEST_RANK_BOARDS or device.platform != "cuda":
        return 0
    channels = nccl.board_channels(device.compute_capability) or NCCL_NODE_CHANNELS
    return nccl.fullest_over_first_bytes(tp, channels, nccl.p2p_read(device.compute_capability))


# RCCL over xGMI (Infinity Fabric) above 2 ranks: one communicator's buffers per GPU, in place of the NVLink rule
# above (whose per-peer fit is NVIDIA's). RCCL keeps NCCL's buffer sizes (4 MiB Simple per channel and peer, plus LL /
# LL128) but on a fully connected xGMI node it builds many more channels than NCCL on NVLink (one ring per link
# direction, and more per link on gfx942 / gfx950), so the same code holds about three times the memory. No vLLM log
# isolates it; the calibration figure is SGLang's (the same PyNccl / RCCL code): sglang-rocmcompat-mi355x-kimi-k25-tp8,
# 0.5.8.post1, 4.45 GiB in use on the fullest rank before loading, less the 0.80 GiB HIP context and 0.02 -> 3.63 GiB
# for one communicator at tp 8 (kvplan.engines.sglang_overhead takes it from here). Like SGLang's rule it does not grow
# with the ranks above 2 (ring / tree neighbours only) and is taken for tp 4 - 16 alike; at tp 2 the NVLink-class
# figure stands (the rocm-blog tp-2 MI300X starts, V1, are within 0.6% with it). vLLM V0 (0.6 - 0.7) at tp > 2 on
# ROCm holds two such communicators (PyNccl's and torch.distributed's; no custom all-reduce there), which is most of
# what V0 MI300X tp-8 logs charge above the NVLink rule (validation, not fitted: Llama-2-7B at tp 8 charges 3.34 GiB
# above it, this rule adds 5.48, so on MI300X (gfx942) it plans about 1 GiB per communicator more than that log held:
# the safe side; the MI355X (gfx950) figure may hold more channels than MI300X's RCCL builds).
RCCL_XGMI_WIDE_BYTES = round(3.63 * GiB)
# vLLM on ROCm: what kvplan.engines.spread.UNMODELLED_NON_TORCH_PLATFORMS says, for the plan's notes.
ROCM_NON_TORCH_NOTE = ("vLLM on ROCm charges non-torch memory kvplan's formula leaves out: hipBLASLt (PyTorch's BLAS on "
                       "MI200 / MI300 / MI355; TORCH_BLAS_PREFER_HIPBLASLT=0 turns it off) loads the GEMM kernels the "
                       "profile run meets outside torch's allocator, a size that is the installation's (1.7 GiB more at "
                       "tp 1 in a V0 log with it on than off); the estimate allows the calibration logs' median where "
                       "logs of this class measured it, else nothing, so kvplan may promise more KV than the engine "
                       "gives: pass --overhead-gib with your log's non-torch memory")
CUSTOM_ALLREDUCE_BYTES = 18 * MiB  # 2 x max_size 8 MiB IPC buffers + metadata, cudaMalloc'd (non-torch)
# V0 (0.6.0 - 0.7.x; read in 0.6.6, 0.7.2 and 0.7.3: worker.py init_device, distributed/parallel_state.py,
# device_communicators/custom_all_reduce.py, config.py ParallelConfig). The baseline is taken in init_device before
# init_worker_distributed_environment, so everything below is made after it and charged as non-torch memory:
# - the tp group's PyNccl communicator (made eagerly, ensure_model_parallel_initialized) and its torch.distributed
#   NCCL communicator (made lazily by the profile run's first collective: the logits gather / all_gather): the
#   two communicators of nccl_communicator_bytes, with their NVLS buffers on NVSwitch boards above 2 GPUs;
# - the pp group's PyNccl communicator at pp > 1 (use_custom_allreduce=False; its send/recv goes through PyNccl),
#   ranks i, i + tp, ...: on one node (tp x pp <= NVLINK_PEERS_PER_NODE) a communicator of pp ranks over the board,
#   across nodes two ring peers reached over the network, for which kvplan takes the board's 2-rank channel figure
#   (no log isolates a network communicator; NVLS does not span nodes);
# - custom all-reduce (CustomAllreduce.__init__): two cudaMalloc'd IPC buffers (meta_size() + 8 MiB and 8 MiB,
#   max_size 8192 x 1024), the 8 MiB rank_data a torch tensor made before the weights (charged nowhere). On only
#   where the group is on one node, its size is one of _SUPPORTED_WORLD_SIZES (2, 4, 6, 8), it is 2 GPUs or fully
#   NVLink-connected, P2P works, and the platform is CUDA (ParallelConfig turns it off on ROCm: "not supported on
#   AMD GPUs"). P2P is the installation's (GeForce drivers and some containers report none; the corpus has A100
#   logs without it): kvplan charges the buffers where the board allows them (18 MiB, the safe side).
V0_CUSTOM_ALLREDUCE_SIZES = (2, 4, 6, 8)
# FlashInfer's all-reduce + RMSNorm fusion workspace (0.17+, on by default at -O2 for tp > 1, pp 1, dp 1, compute
# capability 9.0 / 10.x: vllm/config/vllm.py enable_allreduce_rms_fusion). One workspace per process
# (vllm/distributed/device_communicators/flashinfer_all_reduce.py; the quant-fusion workspace aliases it, except in
# 0.25, whose get_fi_ar_quant_workspace "always uses trtllm": a second workspace, trtllm's three buffers beside
# mnnvl's one, made by AllReduceFusionPass.__init__ for every model; 0.26 reuses the main one), made
# when the compile passes are built (AllReduceFusionPass.__init__), after the profiler's snapshot: non-torch memory
# the profile charges. T = min(max_size // (hidden x 2), max_num_batched_tokens), max_size by capability and tp
# (FI_ALLREDUCE_FUSION_MAX_SIZE_MB, the same in 0.17 - 0.33). Its backend and buffers by release (the FlashInfer
# each pins, flashinfer/comm/trtllm_ar.py, trtllm_mnnvl_ar.py, mnnvl.py):
# - trtllm (0.17 - 0.24, FlashInfer 0.6.4 - 0.6.12): three SymmDeviceMemory buffers - tp x T x hidden x 2 B, the
#   barrier flags tp x 256 x 4 B, the lamport buffers 3 x tp x T x hidden x 2 B - each rounded up to the multicast
#   granularity (cuMulticastGetGranularity RECOMMENDED, _get_allocation_prop) although multicast is off: 3 x 512
#   MiB = 1.5 GiB per GPU at any tp. Without multicast (no NVSwitch) SymmDeviceMemory raises and vLLM runs
#   without the fusion.
# - mnnvl (0.25+, the default on one node too): one multicast buffer of 3 x max(one-shot, two-shot) bytes (one-shot
#   min(1 MiB // (tp x hidden x 2), T) x hidden x tp x 2, two-shot 2 x ceil(T / tp) x tp x hidden x 2), rounded up to
#   the multicast granularity: 512 MiB at the default sizes. 0.25 - 0.26 (FlashInfer 0.6.13 - 0.6.14) allocate it
#   through torch's symmetric memory, whose rounding kvplan takes to be the same.
# - trtllm without multicast (0.27+, FlashInfer 0.6.16+: vLLM falls back to it on one node without NVSwitch
#   multicast; SymmDeviceMemory no longer needs multicast): the three buffers rounded to the 2 MiB allocation
#   granularity, about 4 x tp x T x hidden x 2 (514 MiB at tp 2 with 8,192 tokens of hidden 4,096). Whether it
#   starts without P2P is not known: kvplan charges it (the safe side).
# The 512 MiB is the granularity Hopper reports for multicast objects (NCCL's NVLS buffers are rounded the same);
# it is read in the code, not in a corpus log, and Blackwell takes the same value (the safe side: more non-torch
# memory, less KV). --enforce-eager builds no compile passes and no workspace.
ALLREDUCE_FUSION_FROM = (0, 17, 0)
FUSION_MNNVL_FROM = (0, 25, 0)  # _resolve_fi_ar_backend: "auto" picks mnnvl on one node too
FUSION_QUANT_APART = ((0, 25, 0), (0, 26, 0))  # the quant-fusion workspace is trtllm's own (0.25 only)
FUSION_TRTLLM_FALLBACK_FROM = (0, 27, 0)  # FlashInfer 0.6.16.post3: trtllm without multicast, 2 MiB rounding
FUSION_MULTICAST_GRANULARITY_BYTES = 512 * MiB
FUSION_ALLOC_GRANULARITY_BYTES = 2 * MiB
FUSION_BARRIER_FLAGS = 256  # BarrierFlagCount (int32 each)
FUSION_SIGNAL_PAD_BYTES = 2048  # SIGNAL_PAD_SIZE, on top of a SymmDeviceMemory buffer
MNNVL_ONE_SHOT_THRESHOLD_BYTES = 64 * 1024 * 8 * 2
FUSION_MAX_BYTES = {(9, 0): {2: 64 * MiB, 4: 2 * MiB, 8: MiB // 2},
                    (10, 0): {2: 64 * MiB, 4: 32 * MiB, 8: 1 * MiB},
                    (10, 3): {2: 64 * MiB, 4: 64 * MiB, 8: 2 * MiB}}

CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE = 300 * 1024  # per extra captured size and decoder layer (calibrated)
MAX_CUDAGRAPH_CAPTURE_SIZE = 512


@frozen
class NonTorch:
    """The memory vLLM's profiler charges outside the torch peak, per GPU (bytes), as named parts."""

    base: int  # cuBLAS / attention workspaces created during profiling (NON_TORCH_BYTES)
    context: int  # the CUDA / HIP context (releases that charge all non-torch memory)
    channels: int  # the counted NCCL communicators' channel buffers (NCCL_CHANNEL_BYTES each)
    nvls: int  # their NVLink SHARP buffers (NVSwitch boards above 2 GPUs: NVLS_BYTES_PER_RANK x tp each)
    custom_allreduce: int  # vLLM's custom all-reduce IPC buffers (releases that count them)
    fusion: int  # the all-reduce + RMSNorm fusion workspace (0.17+, NVSwitch boards; fusion_workspace_bytes)
    interconnect: str
    counted: int  # how many tensor-parallel NCCL communicators the release counts
    pipeline: int = 0  # V0's pp-group PyNccl communicator at pp > 1 (v0_pipeline_bytes)
    nvls_gap: int = 0  # what 288 MiB x tp of NVLS per counted communicator (V0's figure) would add above NCCL's own
    # sizes (V1): not in ``bytes``; the range's low end pays it
    fullest_rank: int = 0  # the counted communicators' send buffers the pool's fullest rank holds above rank 0's
    # (fullest_rank_bytes each): a log's memory-profiling lines are rank 0's, its pool the fullest rank's

    @property
    def communicators(self) -> int:
        """The NCCL communicators' buffers (tp and pp groups) and custom all-reduce, bytes per GPU."""
        return self.channels + self.nvls + self.custom_allreduce + self.pipeline + self.fullest_rank

    @property
    def bytes(self) -> int:
        return self.base + self.context + self.communicators + self.fusion

    def parts(self) -> tuple[tuple[str, int], ...]:
        """The non-zero parts as ``(name, bytes)``, in the order the profile meets them."""
        named = (("tp-1 increase", self.base), ("CUDA / HIP context", self.context), ("NCCL channels", self.channels),
                 ("NVLS buffers", self.nvls), ("the fullest rank's NCCL send buffers", self.fullest_rank),
                 ("custom all-reduce", self.custom_allreduce),
                 ("pp NCCL communicator", self.pipeline),
                 ("all-reduce fusion workspace", self.fusion))
        return tuple((name, size) for name, size in named if size)


def rope_cache_bytes(spec: ModelSpec, act_bytes: int) -> int:
    """The rotary cos/sin tables vLLM allocates while loading, replicated on every rank: ``get_rope`` builds each
    distinct cos/sin table once while the model loads (``RotaryEmbedding.__init__``: ``cache.to(dtype)``, a
    non-persistent buffer), so vLLM's "Model loading took" includes them, and so does kvplan's weights term
    (``vllm._loaded_weights``): a log's weights figure and kvplan's measure the same bytes.

    ``sum(positions x rotary_dim) x dtype bytes`` over the spec's distinct tables (:mod:`kvplan.model.rope_vision`):
    Llama-3.1-8B 131,072 x 128 x 2 B = 32 MiB (its logged weights are 14.9888 GiB against a 14.9577 GiB
    checkpoint; Llama-3-8B at 8,192 positions: 2 MiB, 14.9595 GiB); Gemma-3-27B a local table of 131,072 rows
    and a global one of 131,072 x 8 (linear scaling) = 288 MiB; MLA models rotate ``qk_rope_head_dim`` dimensions
    (DeepSeek-R1: 163,840 x 64 x 2 B = 20 MiB).
    """
    return sum(t.positions * t.rotary_dim for t in spec.rotary_caches) * act_bytes


def nccl_communicator_bytes(tp: int, interconnect: str) -> tuple[int, int]:
    """One NCCL communicator's buffers per GPU for ``tp`` ranks over ``interconnect``, ``(channels, nvls)``:
    channel buffers (:data:`NCCL_CHANNEL_BYTES` at tp 2, + :data:`NCCL_PEER_BYTES` per further peer of one node; RCCL over
    Infinity Fabric above 2 ranks :data:`RCCL_XGMI_WIDE_BYTES`), and NVLS multicast buffers on NVSwitch boards above 2 GPUs (NCCL's ncclNvlsInit leaves NVLS
    off at 2 GPUs; :data:`NVLS_BYTES_PER_RANK` per rank: V0's figure, which :func:`non_torch` replaces with NCCL's own
    sizes for V1)."""
    if interconnect == "infinity-fabric" and tp > 2:
        return RCCL_XGMI_WIDE_BYTES, 0  # RCCL over xGMI: many more channels, not growing with the ranks
    channels = (NCCL_CHANNEL_BYTES.get(interconnect, NCCL_CHANNEL_BYTES["nvlink"])
                + max(0, min(tp, NVLINK_PEERS_PER_NODE) - 2) * NCCL_PEER_BYTES.get(interconnect, NCCL_PEER_BYTES["nvlink"]))
    # NVLS spans one NVLink domain: its buffers scale with the ranks of one node (nvlsTotalSize = per-rank x heads)
    local = min(tp, NVLINK_PEERS_PER_NODE)
    nvls = NVLS_BYTES_PER_RANK * local if interconnect == "nvlink-switch" and tp > 2 else 0
    return channels, nvls


def v0_custom_allreduce_bytes(tp: int, device: Device) -> int:
    """V0's custom all-reduce IPC buffers per GPU (bytes; :data:`V0_CUSTOM_ALLREDUCE_SIZES`): 0 on ROCm, at a tp
    it does not support or across nodes, and on more than 2 PCIe GPUs; else :data:`CUSTOM_ALLREDUCE_BYTES`."""
    interconnect = device.interconnect or "nvlink"
    if device.platform == "rocm" or tp not in V0_CUSTOM_ALLREDUCE_SIZES or tp > NVLINK_PEERS_PER_NODE:
        return 0
    return 0 if interconnect == "pcie" and tp > 2 else CUSTOM_ALLREDUCE_BYTES


# V0 0.6.0 - 0.6.3 ("free-delta": vllm/worker/worker.py determine_num_available_blocks charges init free memory - the
# free memory after profile_run, with no empty_cache between) charge the torch caching allocator's *reserved* memory at
# the profile's end, not its allocated peak. At tp >= 2 each decoder layer all-reduces its o_proj and down_proj outputs
# in place (GroupCoordinator.all_reduce -> torch.ops.vllm.inplace_all_reduce -> torch.distributed.all_reduce: PyNccl is
# on only inside graph capture, and custom all-reduce takes only inputs under its 8 MiB max_size; on ROCm it is off).
# ProcessGroupNCCL records each input on its NCCL stream (recordStream; torch 2.4's TORCH_NCCL_AVOID_RECORD_STREAMS is
# off; pytorch#76861: recordStream keeps a collective's input from being repurposed until the collective finishes from
# the host's view), so when the layer drops that hidden-sized tensor the allocator keeps its block until an event on
# the NCCL stream - recorded at the free, behind the all-reduce just queued - completes. The CPU is ahead of the GPU by at
# least that all-reduce when the MLP allocates its gate/up and down outputs, so the block is not reused and one more
# hidden-sized block is reserved at the MLP's peak (tokens x hidden x dtype bytes: 4 GiB for Llama-3.1-405B at
# 131,072 profiled tokens; validation: vllm-f43425326930-mi300x-llama31-405b-tp8 charges 4.27 GiB above kvplan's
# other terms). More blocks stay reserved if the CPU runs several layers ahead: the point estimate is one, the
# activation's spread pays the rest. From 0.6.4 the profile charges the allocated peak (memory_stats), not this.
V0_DEFERRED_FREE_MEASURES = ("free-delta",)
V0_CUSTOM_ALLREDUCE_MAX_BYTES = 8 * MiB  # CustomAllreduce max_size: larger inputs go to torch.distributed


def deferred_allreduce_bytes(p: Profile, spec: ModelSpec, tp: int, tokens: int, act_bytes: int,
                             device: Device | None = None) -> int:
    """The hidden-sized block the caching allocator keeps reserved at the profile's MLP peak behind an NCCL
    all-reduce, per GPU (bytes; see :data:`V0_DEFERRED_FREE_MEASURES`): ``tokens x hidden x act_bytes`` for a
    release whose profile charges reserved memory, at tp >= 2, where the all-reduce goes through torch.distributed
    (ROCm; CUDA without custom all-reduce or above its max size); else 0."""
    if p.measure not in V0_DEFERRED_FREE_MEASURES or tp < 2:
        return 0
    size = tokens * spec.hidden_size * act_bytes
    custom = v0_custom_allreduce_bytes(tp, device or Device()) > 0 and size < V0_CUSTOM_ALLREDUCE_MAX_BYTES
    return 0 if custom else size


def v0_pipeline_bytes(tp: int, pp: int, interconnect: str) -> int:
    """V0's pp-group PyNccl communicator per GPU (bytes; 0 at pp 1): a communicator of ``pp`` ranks over the board
    where the whole deployment is one node (:func:`nccl_communicator_bytes`, NVLS included), else the board's
    2-rank channel buffers (two ring peers on other nodes)."""
    if pp < 2:
        return 0
    if tp * pp <= NVLINK_PEERS_PER_NODE:
        return sum(nccl_communicator_bytes(pp, interconnect))
    return nccl_communicator_bytes(2, interconnect)[0]


def fusion_backend(p: Profile, tp: int, pp: int, device: Device) -> str | None:
    """Which FlashInfer all-reduce fusion workspace release ``p`` makes on ``device`` (see
    :data:`FUSION_MAX_BYTES`): ``trtllm`` (0.17 - 0.24, NVSwitch multicast needed; 0.27+ without multicast),
    ``mnnvl`` (0.25+ with multicast) or None (no fusion: before 0.17, tp 1, pp > 1, another capability)."""
    if (p.first < ALLREDUCE_FUSION_FROM or tp < 2 or pp > 1 or device.capability not in FUSION_MAX_BYTES):
        return None
    multicast = device.interconnect == "nvlink-switch"
    if multicast:
        return "mnnvl" if p.first >= FUSION_MNNVL_FROM else "trtllm"
    return "trtllm" if p.first >= FUSION_TRTLLM_FALLBACK_FROM else None


def fusion_buffer_bytes(backend: str, multicast: bool, hidden_size: int, tp: int, max_num_batched_tokens: int,
                        capability: tuple[int, int]) -> tuple[int, ...]:
    """The fusion workspace's buffers per GPU as allocated (bytes): trtllm's three (buffer, barrier flags,
    lamport), mnnvl's one; each rounded up to the multicast granularity where ``multicast`` (the
    SymmDeviceMemory of FlashInfer 0.6.4 - 0.6.14, and mnnvl's multicast buffer) or to 2 MiB."""
    sizes = FUSION_MAX_BYTES[capability]
    below = [k for k in sizes if k <= tp]
    max_size = sizes.get(tp, sizes[max(below)] if below else 0)
    tokens = min(max_size // (hidden_size * 2), max_num_batched_tokens)
    grain = FUSION_MULTICAST_GRANULARITY_BYTES if multicast else FUSION_ALLOC_GRANULARITY_BYTES

    def allocated(size: int) -> int:
        return -(-(size + FUSION_SIGNAL_PAD_BYTES) // grain) * grain

    if backend == "mnnvl":
        one_shot_tokens = min(MNNVL_ONE_SHOT_THRESHOLD_BYTES // (tp * hidden_size * 2), tokens)
        one_shot = one_shot_tokens * hidden_size * tp * 2
        two_shot = 2 * -(-tokens // tp) * tp * hidden_size * 2
        return (allocated(3 * max(one_shot, two_shot)),)
    buffer = tp * tokens * hidden_size * 2
    return allocated(buffer), allocated(tp * FUSION_BARRIER_FLAGS * 4), allocated(3 * buffer)


def quant_fusion_apart(p: Profile, backend: str | None) -> bool:
    """Whether release ``p`` makes the quant fusion its own trtllm workspace beside ``backend``'s (mnnvl in 0.25:
    :data:`FUSION_QUANT_APART`)."""
    return backend == "mnnvl" and FUSION_QUANT_APART[0] <= p.first < FUSION_QUANT_APART[1]


def fusion_workspace_bytes(p: Profile, spec: ModelSpec, tp: int, pp: int, max_num_batched_tokens: int,
                           device: Device) -> int:
    """FlashInfer's all-reduce + RMSNorm fusion workspace per GPU (0 where vLLM does not make one): the sum of
    :func:`fusion_buffer_bytes` for :func:`fusion_backend` - 1.5 GiB at any tp in 0.17 - 0.24, 2 GiB in 0.25 (mnnvl's
    512 MiB and the quant fusion's own trtllm 1.5 GiB, :data:`FUSION_QUANT_APART`) and 512 MiB from 0.26 on NVSwitch
    boards; about ``4 x tp x T x hidden x 2`` from 0.27 on other boards of those GPUs."""
    backend = fusion_backend(p, tp, pp, device)
    if backend is None:
        return 0
    multicast = device.interconnect == "nvlink-switch"  # 0.27+'s trtllm runs only without it
    main = sum(fusion_buffer_bytes(backend, multicast, spec.hidden_size, tp, max_num_batched_tokens, device.capability))
    if quant_fusion_apart(p, backend):
        main += sum(fusion_buffer_bytes("trtllm", multicast, spec.hidden_size, tp, max_num_batched_tokens,
                                        device.capability))
    return main


def communicators_counted(p: Profile, device: Device) -> int:
    """How many tensor-parallel NCCL communicators release ``p``'s profiler charges at tp >= 2: both (PyNccl's and
    torch.distributed's) where the snapshot comes before NCCL starts (0.6.5 - 0.10.x) or all non-torch memory counts;
    after a post-NCCL snapshot (0.11+) only torch.distributed's, which the profile's first all-gather on the device
    group makes - none where that all-gather runs on PyNccl (``Profile.tp_gather``, 0.26+ on CUDA)."""
    if p.measure not in ("post-nccl", "consumed"):
        return 2
    return 0 if p.tp_gather == "pynccl" and device.platform == "cuda" else 1


def non_torch(p: Profile, tp: int, device: Device | None = None, pp: int = 1, spec: ModelSpec | None = None,
              max_num_batched_tokens: int = 0) -> NonTorch:
    """What release ``p`` charges as non-torch memory per GPU (:data:`MEASURES`), part by part: the tp-1
    increase, the CUDA / HIP context where all non-torch memory counts (:data:`CONTEXT_BYTES_BY_PLATFORM`), the NCCL communicators it counts (two before
    0.11 - PyNccl's and torch.distributed's - plus custom all-reduce; from 0.11 only torch.distributed's, created
    lazily during the profile: v1/worker/gpu_worker.py init_device takes the snapshot after
    init_worker_distributed_environment, which makes PyNccl, custom all-reduce and symmetric memory), their NVLS
    buffers, and the all-reduce fusion workspace. An unknown interconnect (``--gpu-memory`` alone) counts as
    ``nvlink``."""
    device = device or Device()
    interconnect = device.interconnect or "nvlink"
    context = CONTEXT_BYTES_BY_PLATFORM.get(device.platform, CUDA_CONTEXT_BYTES) if p.measure == "absolute" else 0
    counted = channels = nvls = custom = fullest = nvls_gap = 0
    if tp >= 2:
        counted = communicators_counted(p, device)
        one_channels, one_nvls = nccl_communicator_bytes(tp, interconnect)
        release = nccl.engine_nccl("vllm", (tuple(p.first) + (0, 0, 0))[:3])
        if p.mode == "V1" and one_nvls and release is not None:  # NCCL's own NVLS sizes (NVLS_BYTES_PER_RANK)
            code = nccl.nvls_bytes(release, min(tp, NVLINK_PEERS_PER_NODE), device.compute_capability)
            nvls_gap, one_nvls = counted * max(0, one_nvls - code), min(one_nvls, code)
        channels, nvls, fullest = counted * one_channels, counted * one_nvls, counted * fullest_rank_bytes(tp, device)
        if p.mode == "V0":
            custom = v0_custom_allreduce_bytes(tp, device)
        elif counted == 2 and not (interconnect == "pcie" and tp > 2):  # custom all-reduce: off on > 2 PCIe GPUs
            custom = CUSTOM_ALLREDUCE_BYTES
    pipeline = v0_pipeline_bytes(tp, pp, interconnect) if p.mode == "V0" else 0
    fusion = fusion_workspace_bytes(p, spec, tp, pp, max_num_batched_tokens, device) if spec else 0
    return NonTorch(p.non_torch_bytes, context, channels, nvls, custom, fusion, interconnect, counted, pipeline,
                    fullest_rank=fullest, nvls_gap=nvls_gap)


def kept_workspace_bytes(p: Profile, spec: ModelSpec, tp: int, max_num_batched_tokens: int, act_bytes: int,
                         expert_parallel: bool = False) -> int:
    """The fused-MoE workspaces release ``p`` keeps allocated after the profile run, per GPU (0 where it frees
    them, and for a dense model): :func:`~kvplan.engines.forward_parts`' kept bytes over the profiled batch."""
    return forward_parts(spec, tp, max_num_batched_tokens, act_bytes, p.moe, p.moe_chunk, expert_parallel)[1]


def consumed_workspace_bytes(p: Profile, spec: ModelSpec, tp: int, max_num_batched_tokens: int, act_bytes: int,
                             expert_parallel: bool = False) -> int:
    """The kept fused-MoE workspaces (:func:`kept_workspace_bytes`) where the release charges them as consumed
    memory, not activation (0.27+, ``measure`` "consumed": ``total_consumed`` is the drop in free memory, which
    holds every buffer still allocated after the profile run, and the activation printed is only the transient
    ``torch_peak - torch_allocated`` on top; utils/mem_utils.py ``memory_profiling``), else 0."""
    if p.measure != "consumed":
        return 0
    return kept_workspace_bytes(p, spec, tp, max_num_batched_tokens, act_bytes, expert_parallel)


# The V2 model runner's per-request sampler tables of fixed width, in int32 / fp32 elements (v1/worker/gpu/sample,
# read in 0.25.0 - 0.28.0): allowed token ids, logit-bias ids and values (1,024 each), stop token ids (128), bad-word
# tokens (1,024) and offsets (128 + 1), logprob token ids (MAX_LOGPROB_TOKEN_IDS 128).
V2_FIXED_STATE_ELEMENTS = 1024 + 1024 + 1024 + 128 + 1024 + 129 + 128


def v2_sampler_state_bytes(vocab_size: int, max_num_seqs: int, speculative_tokens: int = 0) -> int:
    """Bytes per GPU of the V2 model runner's sampler states (made in ``load_model`` after the weights are measured,
    still allocated after the profile run: consumed memory where the release's ``measure`` is "consumed", 0.27+).

    Per request slot (``max_num_reqs`` = ``max_num_seqs``), int32: the penalties' ``output_bin_counts`` over the
    vocab (sample/penalties.py; "can be very large, taking up GBs"), its ``prompt_bin_mask`` and the structured
    outputs' ``grammar_bitmask`` (one per decoded token: ``1 + speculative_tokens``) over ``vocab / 32`` words, and the
    fixed-width tables (:data:`V2_FIXED_STATE_ELEMENTS`). Qwen3-32B's 151,936-token vocab at 1,024 slots: 1,024 x
    (151,936 + 2 x 4,748 + 4,481) x 4 B = 0.63 GiB. Only the last pipeline stage builds a sampler. 0.25 - 0.26 measure
    the torch peak's increase during the profile, which these (made before it) are not part of: the pool overshoots
    ``gpu_memory_utilization`` by them there."""
    words = -(-vocab_size // 32)
    return max_num_seqs * (vocab_size + words * (2 + speculative_tokens) + V2_FIXED_STATE_ELEMENTS) * 4


def v1_runner_buffer_bytes(spec: ModelSpec, max_num_batched_tokens: int, act_bytes: int) -> int:
    """Bytes per GPU of the V1 model runner's persistent input buffers that scale with the batch (read in 0.27.1
    v1/worker/gpu_model_runner.py ``__init__``, made after the profiler's snapshot): ``inputs_embeds``
    ``[max_num_batched_tokens, hidden]`` in the model dtype and the input batch's slot mapping ``[tokens]`` int64.
    Left out: the per-token index buffers (under 30 B a token) and the placeholder block table, ``[max_num_seqs,
    max_model_len / block_size]`` int32 (32 MiB at 1,024 slots and 131,072 tokens), which would make the budget depend
    on the context it is solved for. Llama-3.1-8B at 8,192 tokens: 64 MiB + 64 KiB."""
    return max_num_batched_tokens * (spec.hidden_size * act_bytes + 8)


def charged_runner_buffers(p: Profile, spec: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int,
                           act_bytes: int, features: Features, last_stage: bool, notes: list[str],
                           platform: str = "cuda") -> tuple[int, str]:
    """``(bytes, what)``: the model runner's persistent buffers release ``p`` charges on this stage. The V2 runner's
    sampler states (:func:`v2_sampler_state_bytes`; last stage only): all of them from 0.27, 0.25 - 0.26 none, with
    a note in ``notes`` that the GPU holds them anyway. The V1 runner's input buffers
    (:func:`v1_runner_buffer_bytes`): from 0.27; before, they are torch memory made before the profile, which the
    earlier measures leave out."""
    if not on_v2_runner(p, spec, features.speculative, platform):
        if p.measure != "consumed":
            return 0, ""
        return (v1_runner_buffer_bytes(spec, max_num_batched_tokens, act_bytes),
                "the V1 model runner's input buffers (inputs_embeds)")
    if not last_stage:
        return 0, ""
    states = v2_sampler_state_bytes(spec.vocab_size, max_num_seqs, features.speculative_tokens)
    if p.measure == "consumed":
        return states, "the V2 model runner's sampler states (per-request token counts over the vocab)"
    notes.append(f"vllm {p.version}'s V2 model runner keeps {states / GiB:.2f} GiB of sampler states per GPU that its "
                 "profiler does not charge: the KV pool is planned as the engine sizes it, and the GPU holds that much "
                 "above gpu_memory_utilization")
    return 0, ""


def overhead_term(p: Profile, spec: ModelSpec, tp: int, act_bytes: int, device: Device | None = None,
                  pp: int = 1, max_num_batched_tokens: int = 0, expert_parallel: bool = False,
                  runner_buffers: tuple[int, str] = (0, "")) -> tuple[Term, list[str], NonTorch]:
    """The overhead term (non-torch memory at this tp and interconnect + the fused-MoE workspaces and the model
    runner's persistent buffers, ``runner_buffers`` (:func:`charged_runner_buffers`), a 0.27+ release counts as
    consumed memory), at tp >= 2 a note that says the multi-GPU part is an estimate, and the non-torch parts it was
    built from (:func:`non_torch`)."""
    buffers, buffers_what = runner_buffers
    nt = non_torch(p, tp, device, pp, spec, max_num_batched_tokens)
    kept = consumed_workspace_bytes(p, spec, tp, max_num_batched_tokens, act_bytes, expert_parallel)
    total = nt.bytes + kept + buffers  # the term: every figure below that speaks of it says this one number
    parts = [f"non-torch {nt.base / GiB:.2f} GiB at tp 1 (cuBLAS, workspaces)"]
    if nt.context:
        runtime = "HIP" if device is not None and device.platform == "rocm" else "CUDA"
        parts.append(f"{runtime} context {nt.context / GiB:.2f} GiB (this release charges all non-torch memory)")
    notes = []
    if tp >= 2 and not nt.counted:
        first = ".".join(map(str, min(q.first for q in PROFILES.values() if q.tp_gather == "pynccl")))
        parts.append(f"no NCCL communicator at tp {tp} (from {first} vLLM runs the profile's all-gathers on PyNccl, "
                     "made before the profiler's snapshot: no torch.distributed communicator is made during it)")
    if tp >= 2:
        notes.append(f"non-torch memory at tp {tp} over {nt.interconnect} is an estimate (the overhead term "
                     f"{total / GiB:.2f} GiB per GPU; logs range 0.2 - 7 GiB at tp 2 - 8): pass --overhead-gib with your "
                     "log's non-torch memory")
    if tp >= 2 and nt.counted:
        parts.append(f"{plural(nt.counted, 'NCCL communicator')} at tp {tp} over {nt.interconnect} "
                     f"{(nt.communicators - nt.pipeline) / GiB:.2f} GiB"
                     + (" (NVLS buffers included)" if nt.interconnect == "nvlink-switch" and tp > 2 else "")
                     + (f" on the fullest rank, which sizes the pool ({nt.fullest_rank / MiB:,.0f} MiB of NCCL send "
                        "buffers above rank 0's)" if nt.fullest_rank else ""))
    if nt.pipeline:
        parts.append(f"the pp group's NCCL communicator (pp {pp}) {nt.pipeline / GiB:.2f} GiB")
    if device is not None and device.platform == "rocm":
        notes.append(ROCM_NON_TORCH_NOTE)
    if nt.fusion:
        backend = fusion_backend(p, tp, pp, device or Device())
        if quant_fusion_apart(p, backend):
            backend = "mnnvl + the quant fusion's trtllm"
        parts.append(f"all-reduce fusion workspace {nt.fusion / MiB:,.0f} MiB (FlashInfer {backend})")
        notes.append(f"the all-reduce fusion workspace ({nt.fusion / GiB:.2f} GiB per GPU, FlashInfer's {backend} "
                     "buffers rounded to their granularity) is read in the code, not in a corpus log; --enforce-eager "
                     "builds no compile passes and no workspace")
    if kept:
        parts.append(f"fused-MoE workspaces {kept / GiB:.2f} GiB (kept after the profile run: consumed memory "
                     f"in {p.version})")
    if buffers:
        parts.append(f"{buffers_what} {buffers / GiB:.2f} GiB (made after the weights are measured: consumed memory "
                     f"in {p.version})")
    return Term("overhead", total, "estimate: " + " + ".join(parts)), notes, nt


def capture_sizes(max_size: int) -> list[int]:
    """CUDA-graph batch sizes vLLM captures up to ``max_size``: 1, 2, 4, 8..256 by 8, 272..512 by 16."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, MAX_CUDAGRAPH_CAPTURE_SIZE + 1, 16))
    return [s for s in sizes if s <= max_size]


def cudagraph_bytes(spec: ModelSpec, tp: int, pp: int, max_num_seqs: int, max_num_batched_tokens: int,
                    act_bytes: int, version: str = DEFAULT_VERSION) -> tuple[int, int, int]:
    """vLLM's CUDA-graph memory estimate (0.18+) and the graph counts: ``(bytes, piecewise, full)``.

    Piecewise graphs are captured up to ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``
    tokens, FULL decode graphs up to ``min(max_num_seqs, that)``. vLLM captures the largest graph of
    each mode (its activation pool: the forward peak at that size) and extrapolates the second one
    to the rest; kvplan charges ``300 KiB x decoder layers on this GPU`` per extra graph, calibrated
    on two logs (PIECEWISE=51 + FULL=35 -> 1.62 GiB; PIECEWISE=16 -> 0.36 GiB). An estimate: pass
    ``--cudagraph-gib`` with the number from your log ("Estimated CUDA graph memory").
    """
    p = profile(version)
    largest = min(2 * max_num_seqs, MAX_CUDAGRAPH_CAPTURE_SIZE, max_num_batched_tokens)
    piecewise = capture_sizes(largest)
    full = capture_sizes(min(max_num_seqs, largest))
    layers = -(-spec.num_layers // pp)
    # the graphs' pool holds the forward's transient memory; kept fused-MoE workspaces (0.14+) are the workspace
    # manager's buffer, allocated by the profile run at its larger batch, which the captures reuse
    shared = forward_parts(spec, tp, largest, act_bytes, p.moe, p.moe_chunk)[0]
    extra = (max(0, len(piecewise) - 1) + max(0, len(full) - 1)) * layers * CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE
    return shared + extra, len(piecewise), len(full)
