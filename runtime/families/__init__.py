"""The family registry: every model family's record, found the same way, and what is asked of them all.

A family is two folders: ``edgeattn/families/<name>/`` (its PyTorch side) and
``runtime/families/<name>/`` (its torch-free side), whose ``record.py`` holds ``FAMILY``, its
:class:`~edgeattn.runtime.records.Family` record. Adding a family is those two folders and its name
in :data:`NAMES`.
"""

from __future__ import annotations

import importlib

from edgeattn.config import ModelConfig
from edgeattn.errors import ConfigError
from edgeattn.runtime.records import Family, GraphRole, resolve
from edgeattn.runtime.specs import GraphSpec

__all__ = ["FAMILIES", "NAMES", "Family", "GraphRole", "family_of", "get_family", "resolve"]

#: the families, in the order their graphs, tasks and architectures are listed
NAMES = ("encoder", "seq2seq", "causal", "speech", "vision")


def record_module(name: str) -> str:
    """The module holding family ``name``'s record (``FAMILY``)."""
    return f"{__name__}.{name}.record"


#: Every family, by name.
FAMILIES: dict[str, Family] = {name: importlib.import_module(record_module(name)).FAMILY for name in NAMES}


def family_of(config: ModelConfig) -> Family:
    """The family of a config's architecture."""
    for family in FAMILIES.values():
        if family.architecture == config.architecture:
            return family
    raise ConfigError(f"no model family has architecture {config.architecture!r}")  # pragma: no cover


def get_family(name: str) -> Family:
    """The family called ``name``, or a ConfigError listing them."""
    if name not in FAMILIES:
        raise ConfigError(f"unknown model family {name!r}; families are {', '.join(FAMILIES)}")
    return FAMILIES[name]


def all_graph_names() -> tuple[str, ...]:
    """Every graph name any family exports, each once, in the families' order."""
    return tuple(dict.fromkeys(r.name for f in FAMILIES.values() for r in f.roles))


def all_tasks() -> tuple[str, ...]:
    """Every task any family has, each once."""
    return tuple(dict.fromkeys(t for f in FAMILIES.values() for t in f.tasks))


def task_family(task: str) -> Family:
    """The family whose models do ``task``, or a ConfigError listing the tasks."""
    for family in FAMILIES.values():
        if task in family.tasks:
            return family
    raise ConfigError(f"unknown task {task!r}; tasks are {', '.join(all_tasks())}")


def graph_spec(name: str, config: ModelConfig) -> GraphSpec:
    """The spec of graph ``name`` for this config."""
    family = family_of(config)
    if name not in family.graphs:
        if name in all_graph_names():
            raise ConfigError(f"graph {name!r} is not one a {family.name} model exports ({', '.join(family.graphs)}); "
                              f"this config is architecture={config.architecture!r}")  # fmt: skip
        raise ConfigError(f"unknown graph {name!r}; graphs are {', '.join(all_graph_names())}")
    return family.graphs[name].spec(config)


def offered_graphs() -> list[str]:
    """The graphs ``--graphs`` offers: every family's, less those only ever brought along."""
    return [g for g in all_graph_names() if any(f.graphs[g].requestable for f in FAMILIES.values() if g in f.graphs)]


def resolve_graphs(requested: list[str] | tuple[str, ...] | None, config: ModelConfig) -> list[str]:
    """The graphs to export: ``requested`` (default: every graph of the config's family), each
    bringing the graphs it needs along; a graph of another family is refused."""
    family = family_of(config)
    if not requested:
        return [r.name for r in family.roles if r.applies is None or r.applies(config)]
    names = [n.strip() for n in requested if n.strip()]
    everything = all_graph_names()
    for n in names:
        if n not in everything:
            raise ConfigError(f"unknown graph {n!r}; choose from {', '.join(offered_graphs())}")
        if n not in family.graphs:
            owners = [f for f in FAMILIES.values() if n in f.graphs]
            raise ConfigError(
                f"graph {n!r} needs an {owners[0].architecture} model; this config is "
                f"architecture={config.architecture!r}"
            )
        role = family.graphs[n]
        if role.applies is not None and not role.applies(config):
            raise ConfigError(f"graph {n!r} is not one this {family.name} model has")
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n not in wanted:
            wanted.add(n)
            todo.extend(family.graphs[n].needs)
    return [g for g in family.graph_names if g in wanted]
