"""Adapters for other libraries; each submodule imports its library only when imported.

- ``flashattn2.integrations.transformers``: ``attn_implementation="flashattn2"`` for Hugging
  Face transformers models.
"""
