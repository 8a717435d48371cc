"""The operators that stand for a fused or quantised subgraph (mostly ONNX Runtime's contrib
operators): counted into the manifest for optimised graphs and marked by ``edgeattn inspect``."""

from __future__ import annotations

from collections import Counter

import onnx

FUSED_OPS = (
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "QAttention", "QOrderedAttention",
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "LayerNormalization",
    "SimplifiedLayerNormalization", "BiasGelu", "FastGelu", "Gelu", "BiasSoftmax", "RotaryEmbedding",
    "MatMulNBits", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearMatMul",
    "GatherBlockQuantized", "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear",
)  # fmt: skip
#: The fused operators that each hold one attention block (float or quantised).
ATTENTION_OPS = ("MultiHeadAttention", "Attention", "QAttention", "GroupQueryAttention")


def operator_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many of each fused operator the graph holds, in :data:`FUSED_OPS` order (zeros omitted)."""
    ops = Counter(n.op_type for n in model.graph.node)
    return {op: ops[op] for op in FUSED_OPS if ops[op]}


def fused_attention_count(counts: dict[str, int]) -> int:
    """Attention blocks a graph holds as fused operators."""
    return sum(counts.get(op, 0) for op in ATTENTION_OPS)
