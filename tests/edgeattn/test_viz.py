"""Attention heatmaps are written as real PNG files with token labels."""

from __future__ import annotations

import pytest
import torch

from edgeattn.errors import EdgeattnError
from edgeattn.model import build_model

pytest.importorskip("matplotlib")

from edgeattn.viz import encoder_attention, plot_layer_head  # noqa: E402

pytestmark = pytest.mark.quick


def test_heatmap_png(tmp_path, tiny_config):
    model = build_model(tiny_config, seed=0)
    ids = torch.randint(3, 50, (1, 6))
    weights = encoder_attention(model, ids)
    assert len(weights) == 2 and weights[0].shape == (1, 4, 6, 6)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(1, 4, 6))
    path = plot_layer_head(model, ids, tmp_path / "attn.png", layer=1, head=3, labels=list("abcdef"))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    with pytest.raises(EdgeattnError, match="layer 5 is out of range"):
        plot_layer_head(model, ids, tmp_path / "x.png", layer=5)
