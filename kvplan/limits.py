"""The largest values kvplan accepts, in one table: what bounds the work a typo can ask for.

Each bound is far past any real deployment or checkpoint, so only a typo, a unit mix-up or a hostile file
reaches it; past it the option or config field is refused with a one-line error instead of planning for
minutes (the planner keeps one object per layer, so a million layers is ~40 s and 2 GB).

May import: nothing in kvplan
"""

from __future__ import annotations

MAX_COUNT = 1 << 20  # GPUs, tp, pp, batch, sequences, heads: far past any deployment
MAX_LAYERS = 4096  # decoder layers: the deepest published decoders have ~200
MAX_TOKENS = 1 << 32  # a token count (context, max_model_len, batched tokens): 4 billion tokens
MAX_SIZE_BYTES = 1 << 50  # a size (GPU memory, KV budget, weights): 1 PiB
MAX_DEVICE_BYTES = 1 << 44  # one device's memory (--gpu-memory; a CPU host's too): 16 TiB [288 GB]
MAX_BARE_GIB = 1024  # --gpu-memory without a unit is GiB; a larger bare number is taken for MiB (nvidia-smi's)
MAX_CONFIG_INT = 1 << 48  # any other integer a config sizes something with

# config widths and counts: each 16x or more past the largest published value (in brackets)
MAX_WIDTH = 1 << 20  # hidden and MLP widths: 1,048,576 [hidden 16,384, MLP 73,728]
MAX_HEAD_DIM = 1 << 16  # a head's or a state's dimension, a latent rank: 65,536 [head_dim 512]
MAX_HEADS = 1 << 16  # attention / KV / state heads, state groups: 65,536 [128]
MAX_VOCAB = 1 << 24  # vocabulary entries: 16,777,216 [262,208]
MAX_EXPERTS = 1 << 16  # routed or shared experts, experts per token: 65,536 [512]
MAX_IMAGE_SIDE = 1 << 16  # image / patch side in pixels, tokens per image: 65,536 [896]

# derived from several fields, so a product of in-bound fields cannot be absurd either
MAX_PARAMETERS = 1 << 43  # 8.8 trillion parameters [~2 trillion]
MAX_ROPE_TABLE_ELEMENTS = 1 << 34  # one rotary cos/sin table, positions x rotary_dim: 32 GiB in bf16
#   [Llama 4 Scout: 10,485,760 x 128 = 1.3 G elements, 2.5 GiB]; vLLM builds it on the GPU at load

# config fields (by the name kvplan reads them as) with a tighter bound than MAX_CONFIG_INT
CONFIG_MAXIMA: dict[str, int] = {
    "num_layers": MAX_LAYERS,
    "num_mtp_layers": MAX_LAYERS,
    "max_position_embeddings": MAX_TOKENS,
    "sliding_window": MAX_TOKENS,
    "attention_chunk_size": MAX_TOKENS,
    "bits": 32,  # quantized weight bits (GPTQ / AWQ)
    "group_size": MAX_WIDTH,  # quantized inputs per scale: a group spans at most one row
    "num_bits": 32,  # compressed-tensors weight bits
    "hidden_size": MAX_WIDTH,
    "intermediate_size": MAX_WIDTH,
    "moe_intermediate_size": MAX_WIDTH,
    "shared_expert_intermediate_size": MAX_WIDTH,
    "intermediate_size_mlp": MAX_WIDTH,
    "mamba_d_ssm": MAX_WIDTH,
    "head_dim": MAX_HEAD_DIM,
    "kv_lora_rank": MAX_HEAD_DIM,
    "qk_rope_head_dim": MAX_HEAD_DIM,
    "qk_nope_head_dim": MAX_HEAD_DIM,
    "mamba_d_head": MAX_HEAD_DIM,
    "mamba_d_state": MAX_HEAD_DIM,
    "mamba_d_conv": MAX_HEAD_DIM,
    "mamba_dt_rank": MAX_HEAD_DIM,
    "mamba_expand": MAX_HEAD_DIM,
    "linear_key_head_dim": MAX_HEAD_DIM,
    "linear_value_head_dim": MAX_HEAD_DIM,
    "linear_conv_kernel_dim": MAX_HEAD_DIM,
    "num_attention_heads": MAX_HEADS,
    "kv_heads": MAX_HEADS,
    "num_global_key_value_heads": MAX_HEADS,
    "mamba_n_heads": MAX_HEADS,
    "mamba_n_groups": MAX_HEADS,
    "linear_num_key_heads": MAX_HEADS,
    "linear_num_value_heads": MAX_HEADS,
    "vocab_size": MAX_VOCAB,
    "num_experts": MAX_EXPERTS,
    "num_experts_per_token": MAX_EXPERTS,
    "n_shared_experts": MAX_EXPERTS,
    "image_size": MAX_IMAGE_SIDE,
    "patch_size": MAX_IMAGE_SIDE,
    "num_channels": 64,
    "mm_tokens_per_image": MAX_IMAGE_SIDE,
}
