"""The causal family's record: a decoder-only language model (GPT-2, Llama, Qwen2, Phi-3) as one graph
that reads a prompt or the next tokens over a cache written in place, and how each precision treats
it. Why its precisions are made and judged as they are: docs/precisions.md."""

from __future__ import annotations

from edgeattn.config import ModelConfig
from edgeattn.runtime.families.causal.specs import causal_decoder_spec
from edgeattn.runtime.records import MID, Family, GraphRole, long_length

_HERE = "edgeattn.families.causal"


def causal_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """A decoder-only model's prompt (all its logits, or the last token's) and its steps, over
    caches with slots to spare and filled to the last one."""
    max_len = config.max_len
    mid, long = min(MID, max_len - 8), long_length(max_len) - 8
    many = max(0, min(60, max_len - 8))
    shapes = [(1, mid, 0, 1, 5), (3, mid, 0, mid, 7), (3, 1, 1, 1, 0), (3, 1, many, 1, 3), (1, 6, many, 2, 0),
              (3, long, 0, 1, 2)]  # fmt: skip
    return [{"batch": b, "tgt_len": t, "past_len": p, "picked": k, "capacity": p + t + spare}
            for b, t, p, k, spare in shapes]  # fmt: skip


CAUSAL_DECODER = GraphRole(
    "causal_decoder", causal_decoder_spec, f"{_HERE}.graphs:CausalDecoderGraph", causal_sizes,
    f"{_HERE}.gate:causal_calibration", f"{_HERE}.gate:causal_metrics", lambda c: c.n_decoder_layers,
    decodes=True, in_place=True, int8_activations=True, int4_block_size=64, int4_head_bits=8,
    int4_wide_products=("attn.qkv_proj", "ff.router"), int4_method="gptq", fitter=f"{_HERE}.fit:fit_causal",
    int8_form="blockwise", external_weights=True, cache_types=("float16", "int8"),
    builder=f"{_HERE}.graph_builder:build_causal_decoder",
    # docs/web.md: int4 decodes fastest on onnxruntime-node; in wasm int8 (int4 has no fast kernels there)
    bundle_precisions={"web": ("int8",), "node": ("int4", "int8")},
    bundle_slow={("web", "int4"): "onnxruntime-web's wasm kernels decode a language model's int4 "
                 "some 12x slower than its int8 (2.1 against 27 tokens/s, SmolLM2-135M-shaped)"},
)  # fmt: skip

FAMILY = Family(
    "causal",
    "decoder-only",
    (CAUSAL_DECODER,),
    tasks={"complete": ("causal_decoder",)},
    model=f"{_HERE}.model:CausalLM",
    runtime="edgeattn.runtime.families.causal.runtime:CausalRuntime",
    generation=("causal_decoder",),
    stepper=f"{_HERE}.reference:CausalEagerStepper",
    summary="a decoder-only language model (GPT-2, Llama, Qwen, Phi-3): prompts and chats in, text out",
    # judged per token (teacher-forced top-1, perplexity kept, loops) and its exact-match rate reported,
    # int8 and int4 held to what llama.cpp's Q8_0 and Q4_K_M keep, with a margin (docs/precisions.md)
    limits={"int8": {"exact_match": 0.0, "teacher_top1": 0.93, "perplexity_kept": 0.98},
            "int4": {"exact_match": 0.0, "teacher_top1": 0.75, "perplexity_kept": 0.88, "loop_free": 0.90}},
    bundle_graphs=("causal_decoder",),
    bundle_describer=f"{_HERE}.bundle:describe_causal",
    importers=f"{_HERE}.hf:importers",
    bencher=f"{_HERE}.bench:bench_export",
    config_section=f"{_HERE}.config:CausalLMConfig",
    gate_reference=f"{_HERE}.gate:CausalReference",
    run_hook="edgeattn.runtime.families.causal.cli:RUN",
    api="generate",
)  # fmt: skip
