"""The design card's face of the attention stage: hook-based attribution of attention to the system tokens.

``AttentionShareCapture`` is a context manager over transformers' attention interface
that records, per chosen layer, each token's share of attention on the system span and
always removes itself; the stage lives in ``sysbench_gpu.attention``.
"""

from sysbench_gpu.attention.capture.hooks import AttentionShareCapture, LayerShares
from sysbench_gpu.attention.capture.layers import attention_modules, num_layers, resolve_layers
from sysbench_gpu.attention.capture.span_math import eager_reference_shares

__all__ = [
    "AttentionShareCapture",
    "LayerShares",
    "attention_modules",
    "eager_reference_shares",
    "num_layers",
    "resolve_layers",
]
