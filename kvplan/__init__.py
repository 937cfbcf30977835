"""kvplan: plan KV-cache memory for LLM serving, and prove the plan with a real paged cache."""

__version__ = "0.1.0"
