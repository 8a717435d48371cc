"""Attention-weight heatmaps (needs the ``viz`` extra: matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from edgeattn.errors import EdgeattnError
from edgeattn.model import TransformerModel


def encoder_attention(
    model: TransformerModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Every encoder layer's self-attention weights, each (B, H, S, S)."""
    with torch.no_grad():
        _, weights = model.encoder(model.embed_tokens(input_ids), attention_mask, need_weights=True)
    return weights


def plot_attention(
    weights: torch.Tensor,
    path: str | Path,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Write a heatmap PNG of one (T, S) attention-weight matrix with token labels on the axes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise EdgeattnError("attention plots need matplotlib: pip install 'edgeattn[viz]'") from exc
    if weights.dim() != 2:
        raise EdgeattnError(f"plot_attention takes one (T, S) matrix, got shape {tuple(weights.shape)}")
    t, s = weights.shape
    for labels, n, axis in ((query_labels, t, "query"), (key_labels, s, "key")):
        if labels is not None and len(labels) != n:
            raise EdgeattnError(f"{len(labels)} {axis} labels for {n} {axis} positions")
    fig, ax = plt.subplots(figsize=(max(3.0, 0.4 * s + 1.5), max(3.0, 0.4 * t + 1.0)))
    image = ax.imshow(weights.detach().cpu().float().numpy(), cmap="viridis", vmin=0.0, aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(s), labels=list(key_labels) if key_labels else [str(i) for i in range(s)], rotation=90)
    ax.set_yticks(range(t), labels=list(query_labels) if query_labels else [str(i) for i in range(t)])
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_layer_head(
    model: TransformerModel,
    input_ids: torch.Tensor,
    path: str | Path,
    layer: int = 0,
    head: int = 0,
    labels: Sequence[str] | None = None,
) -> Path:
    """Heatmap of encoder ``layer``/``head`` self-attention for the first row of ``input_ids``."""
    weights = encoder_attention(model, input_ids[:1])
    if not 0 <= layer < len(weights):
        raise EdgeattnError(f"layer {layer} is out of range: the encoder has {len(weights)} layers")
    if not 0 <= head < weights[layer].shape[1]:
        raise EdgeattnError(f"head {head} is out of range: layers have {weights[layer].shape[1]} heads")
    if labels is None:
        labels = [str(int(t)) for t in input_ids[0]]
    return plot_attention(weights[layer][0, head], path, labels, labels, title=f"encoder layer {layer}, head {head}")
