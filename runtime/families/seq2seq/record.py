"""The seq2seq family's record: an encoder-decoder (T5) whose encoder is the encoder family's, its
cross keys and values once per source, and its decoder step over a growing or a fixed cache."""

from __future__ import annotations

from dataclasses import replace

from edgeattn.config import ModelConfig
from edgeattn.runtime.families.encoder.record import ATTENTION, ENCODER, source_sizes
from edgeattn.runtime.families.seq2seq.specs import cross_kv_spec, decoder_fixed_spec, decoder_spec
from edgeattn.runtime.records import MID, Family, GraphRole, long_length

_GRAPHS = "edgeattn.families.seq2seq.graphs"
_HOOKS = "edgeattn.families.seq2seq.gate"


def step_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """Decoder steps after 0, 1 and many cached positions, one token and several."""
    max_len = config.max_len
    mid, long = min(MID, max_len), long_length(max_len)
    many = max(0, min(60, max_len - 6))
    shapes = [(1, mid, 1, 0), (3, mid, 1, 0), (3, mid, 1, 1), (3, mid, 1, many), (3, 1, 6, 0), (1, long, 6, many)]
    return [{"batch": b, "src_len": s, "tgt_len": t, "past_len": p} for b, s, t, p in shapes]


def slot_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """:func:`step_sizes` over a cache of fixed capacity: room to spare after the new tokens, and a
    cache filled to the last slot."""
    sizes = step_sizes(config)
    return [{**z, "capacity": z["past_len"] + z["tgt_len"] + (0 if i % 2 else 7)} for i, z in enumerate(sizes)]


def _decoder_blocks(c: ModelConfig) -> int:
    return 2 * c.n_decoder_layers


CROSS_KV = GraphRole(
    "cross_kv", cross_kv_spec, f"{_GRAPHS}:CrossKVGraph", source_sizes, f"{_HOOKS}:cross_kv_calibration",
    f"{_HOOKS}:cross_kv_metrics", lambda c: 0, once_per_source=True, requestable=False,
)  # fmt: skip
DECODER = GraphRole(
    "decoder", decoder_spec, f"{_GRAPHS}:DecoderGraph", step_sizes, f"{_HOOKS}:decoder_calibration",
    f"{_HOOKS}:decoder_metrics", _decoder_blocks, needs=("encoder", "cross_kv"), decodes=True,
)  # fmt: skip
DECODER_FIXED = replace(DECODER, name="decoder_fixed", spec=decoder_fixed_spec, module=f"{_GRAPHS}:FixedDecoderGraph",
                        sizes=slot_sizes, needs=("decoder",), in_place=True)  # fmt: skip

FAMILY = Family(
    "seq2seq",
    "encoder-decoder",
    (replace(ATTENTION, once_per_source=True), replace(ENCODER, once_per_source=True), CROSS_KV, DECODER,
     DECODER_FIXED),
    tasks={"generate": ("encoder", "cross_kv", "decoder")},
    model="edgeattn.families.seq2seq.model:Seq2SeqTransformer",
    runtime="edgeattn.runtime.families.seq2seq.runtime:Seq2SeqRuntime",
    generation=("encoder", "cross_kv", "decoder"),
    stepper="edgeattn.families.seq2seq.reference:EagerStepper",
    summary="an encoder-decoder (T5 family): text in, text out, generated token by token",
    # its decoder over a cache of fixed capacity; fp32 until its reduced precisions are measured there
    bundle_graphs=("encoder", "cross_kv", "decoder_fixed"),
    bundle_describer="edgeattn.families.seq2seq.bundle:describe_seq2seq",
    importers="edgeattn.families.seq2seq.hf:importers",
    config_fields=("scale_decoder_output",),
    encoder_decoder=True,
    generation_bench="edgeattn.families.seq2seq.generation_bench:bench_generation",
    gate_reference="edgeattn.families.seq2seq.gate:Seq2SeqReference",
    run_hook="edgeattn.runtime.families.seq2seq.cli:RUN",
)  # fmt: skip
