"""The largest values kvplan accepts, in one table: what bounds the work a typo can ask for.

Each bound is far past any real deployment or checkpoint, so only a typo, a unit mix-up or a hostile file
reaches it; past it the option or config field is refused with a one-line error instead of planning for
minutes (the planner keeps one object per layer, so a million layers is ~40 s and 2 GB).
"""

from __future__ import annotations

MAX_COUNT = 1 << 20  # GPUs, tp, pp, batch, sequences, heads: far past any deployment
MAX_LAYERS = 4096  # decoder layers: the deepest published decoders have ~200
MAX_TOKENS = 1 << 32  # a token count (context, max_model_len, batched tokens): 4 billion tokens
MAX_SIZE_BYTES = 1 << 50  # a size (GPU memory, KV budget, weights): 1 PiB
MAX_CONFIG_INT = 1 << 48  # any other integer a config sizes something with

# config fields (by the name kvplan reads them as) with a tighter bound than MAX_CONFIG_INT
CONFIG_MAXIMA: dict[str, int] = {
    "num_layers": MAX_LAYERS,
    "max_position_embeddings": MAX_TOKENS,
    "bits": 32,  # quantized weight bits (GPTQ / AWQ)
    "num_bits": 32,  # compressed-tensors weight bits
}
