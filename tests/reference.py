"""The attention reference of the test suite.

There is one implementation, ``flashattn2._reference``, shipped in the package so that
``python -m flashattn2`` checks against the same code; see its docstrings for conventions.
"""
from flashattn2._reference import attention_ref, visible_mask

__all__ = ["attention_ref", "visible_mask"]
