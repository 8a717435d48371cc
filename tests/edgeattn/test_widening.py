"""A model computed in float64 a module at a time answers exactly as the model widened whole, holds
no module's weights wide outside its call, and gives every tensor back as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeattn.families.causal.model import CausalLM, CausalLMConfig
from edgeattn.widening import module_at_a_time

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("experts", [0, 4])
def test_float64_a_module_at_a_time_equals_the_model_widened_whole(experts):
    torch.manual_seed(0)
    config = CausalLMConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_len=64,
                            tie_embeddings=True, qk_norm=True, n_experts=experts, experts_per_token=2 if experts else 0,
                            expert_d_ff=16 if experts else 0)  # fmt: skip
    model = CausalLM(config).eval()
    ids = torch.randint(3, 50, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        want = CausalLM(config).double().eval()
        want.load_state_dict(model.state_dict())
        expected = want(ids, mask)
        tensors = {name: (t, t.data_ptr()) for name, t in [*model.named_parameters(), *model.named_buffers()]}
        seen = []
        hook = model.layers[1].register_forward_pre_hook(
            lambda m, a: seen.append({n: p.dtype for n, p in model.named_parameters()}))
        with module_at_a_time(model, torch.float64):
            got = model(ids, mask)
        hook.remove()
    assert got.dtype == torch.float64 and torch.equal(got, expected)
    # while layer 1 ran, layer 0's weights were narrow again (the hook runs before its own widening)
    assert seen and all(dtype == torch.float32 for name, dtype in seen[0].items() if name.startswith("layers."))
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        assert t is tensors[name][0] and t.data_ptr() == tensors[name][1] and t.dtype == torch.float32, name


def test_a_forward_reading_another_modules_weight_meets_it_narrow():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.embed(ids) @ self.embed.weight.T  # read outside the embedding's own call

    model = Tied()
    with pytest.raises(RuntimeError), torch.no_grad(), module_at_a_time(model, torch.float64):
        model(torch.tensor([[1, 2]]))
    assert model.embed.weight.dtype == torch.float32  # given back after the failure too
