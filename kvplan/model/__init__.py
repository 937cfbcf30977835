"""Where a model's config comes from and what it means: source -> :class:`~kvplan.model.modelspec.ModelSpec`.

The only place Hugging Face key names live.

- :mod:`kvplan.model.sources`: resolves ``MODEL`` (a local path, a bundled spec, the Hub) to a
  :class:`~kvplan.model.source.ModelSource` (raw config + weight facts + provenance, no interpretation);
- :mod:`kvplan.model.hub`: the Hugging Face Hub through huggingface_hub (imported lazily);
- :mod:`kvplan.model.spec`: the config -> per-layer caches (``build_spec``), reading keys through
  :mod:`~kvplan.model.config_reader` with the model type's defaults (:mod:`~kvplan.model.model_types`);
  layer patterns and variants (:mod:`~kvplan.model.layer_variants`), hybrid state layers
  (:mod:`~kvplan.model.hybrid`), rotary tables and vision towers (:mod:`~kvplan.model.rope_vision`);
- :mod:`kvplan.model.params`, :mod:`~kvplan.model.quant`, :mod:`~kvplan.model.checkpoint`: parameter
  counts, quantization configs and the checkpoint's bytes.

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io
"""
