"""The encoder family's record: an encoder alone (BERT, RoBERTa, DistilBERT), its attention block and
token encoder, and the tasks it answers (hidden states, pooled embeddings, sequence and token labels)."""

from __future__ import annotations

from edgeattn.config import ModelConfig
from edgeattn.runtime.families.encoder.specs import attention_spec, encoder_spec
from edgeattn.runtime.records import MID, Family, GraphRole, blocks_one, long_length

_GRAPHS = "edgeattn.families.encoder.graphs"
_HOOKS = "edgeattn.families.encoder.gate"


def attention_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """A block's query and key lengths apart."""
    max_len = config.max_len
    mid, long = min(MID, max_len), long_length(max_len)
    shapes = [(1, 1, 1), (3, 1, mid), (3, mid, long), (1, long, 1)]
    return [{"batch": b, "tgt_len": t, "src_len": s} for b, t, s in shapes]


def source_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """A source of length 1, 37 and long, batch 1 and 3."""
    max_len = config.max_len
    mid, long = min(MID, max_len), long_length(max_len)
    shapes = [(1, 1), (3, 1), (1, mid), (3, mid), (3, long)]
    return [{"batch": b, "src_len": s} for b, s in shapes]


ATTENTION = GraphRole(
    "attention", attention_spec, f"{_GRAPHS}:AttentionGraph", attention_sizes, f"{_HOOKS}:attention_calibration",
    f"{_HOOKS}:attention_metrics", blocks_one, openvino=True,
)  # fmt: skip
#: a page and Node.js get int8 (docs/web.md: the encoder's bundle precisions)
ENCODER = GraphRole(
    "encoder", encoder_spec, f"{_GRAPHS}:EncoderGraph", source_sizes, f"{_HOOKS}:encoder_calibration",
    f"{_HOOKS}:encoder_metrics", lambda c: c.n_encoder_layers, openvino=True,
    bundle_precisions={"web": ("int8",), "node": ("int8",)},
)  # fmt: skip

FAMILY = Family(
    "encoder",
    "encoder",
    (ATTENTION, ENCODER),
    tasks={task: ("encoder",) for task in ("encode", "embed", "classify", "tag")},
    model="edgeattn.families.encoder.model:EncoderModel",
    runtime="edgeattn.runtime.families.encoder.runtime:EncoderRuntime",
    summary="an encoder alone (BERT family): hidden states, pooled embeddings, sequence or token labels",
    bundle_graphs=("encoder",),
    bundle_describer="edgeattn.families.encoder.bundle:describe_encoder",
    importers="edgeattn.families.encoder.hf:importers",
    transformers_js=True,
    config_fields=("head", "token_types", "position_offset", "pooler"),
    run_hook="edgeattn.runtime.families.encoder.cli:RUN",
    api="embed",
)
