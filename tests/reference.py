"""The attention reference of the test suite.

There is one implementation, ``flashattn2._reference``, shipped in the package so that
``python -m flashattn2`` checks against the same code; see its docstrings for conventions.
"""
from flashattn2._reference import (
    attention_probs,
    attention_ref,
    attention_scores,
    blockwise_probs,
    dropout_keep_mask,
    philox4x32_10,
    visible_mask,
)

__all__ = ["attention_probs", "attention_ref", "attention_scores", "blockwise_probs",
           "dropout_keep_mask", "philox4x32_10", "visible_mask"]
