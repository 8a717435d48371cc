"""The PyTorch side of each exported graph: a module whose flat tensor signature is its spec's.

The same modules are traced for export and run eagerly as the verifier's reference.
"""

from __future__ import annotations

from torch import nn

from edgeattn.model import TransformerModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.specs import GraphSpec


def graph_module(name: str, model: TransformerModel) -> tuple[nn.Module, GraphSpec]:
    """The module to trace for graph ``name`` (its family role's module) and that graph's spec."""
    role = family_of(model.config).role(name)
    module: nn.Module = resolve(role.module)(model)
    return module.eval(), role.spec(model.config)
