"""The real paged KV cache: a plain-Python block allocator (``allocator``), and later the torch pool,
attention over scattered blocks and the validator. Imported only by ``validate`` and ``simulate``;
this file imports nothing so that ``import kvplan.paged.allocator`` stays torch-free."""
