"""The decoder-only family's ``causal_decoder`` graph, written operator by operator from the model's
weights (as onnxruntime-genai's builder writes its graphs) instead of traced.

Why not trace: torch.onnx turns every dynamic ``view`` and every ``index_put`` of the eager model
into its own chain of Shape / Gather / Unsqueeze / Concat / Expand nodes, some 75 per layer, which
ONNX Runtime runs at every decoding step. Written here, each layer is its packed q/k/v product
(the attention's 1 / sqrt(d) folded into the queries' weights), one Reshape per head split (``0``
copies a dimension, so no shape is computed), ONNX Runtime's ``RotaryEmbedding`` over tables of
every position's cos and sin, one ScatterND per cache (the keys and values written in the layout
they are computed in: no transpose), the attention, and the packed gate/up product; the shapes,
the mask and the cache's write indices are made once for all layers. Measured on a
SmolLM2-135M-shaped int4 decoder (2 cores, AVX-512 EPYC, rounds interleaved in one process):
the fused rotation decoded a median 1.09x as fast as a product with a constant rotation matrix,
which was itself 1.04x the traced graph. Standard ONNX operators otherwise (opset 17), which ONNX
Runtime's own fusions reach (RMS norm, SiLU). The graph is checked like a traced one and verified
against the eager :class:`~edgeattn.families.causal.model.CausalLM`
(``edgeattn.families.causal.graphs.CausalDecoderGraph``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgeattn.exporters.external_data import DataSink
from edgeattn.families.causal.model import CausalLM, Experts
from edgeattn.runtime.layout import TRANSPOSED_SUFFIX
from edgeattn.runtime.specs import GraphSpec

_ONNX_TYPE = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
OPSET = 17


class _Builder:
    """Nodes and initializers, with unique names. The initializers are written straight into the
    model the graph becomes (``self.model``): a weight is copied once, into it, and never again; or,
    given a ``data`` file, its bytes go there as it is made and the graph only points at them."""

    def __init__(self, data: DataSink | None = None) -> None:
        self.data = data
        self.model = onnx.ModelProto()
        self.nodes: list[onnx.NodeProto] = []
        self._names: set[str] = set()
        self._count = 0

    def const(self, name: str, array: np.ndarray) -> str:
        array = np.asarray(array)  # 0-d stays 0-d
        tensor = self.model.graph.initializer.add()
        tensor.name, tensor.data_type = name, helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        if self.data is not None:
            self.data.put(tensor, little)
        else:
            tensor.raw_data = np.ascontiguousarray(little).tobytes()
        self._names.add(name)
        return name

    def weight(self, name: str, parts: list[object], make: Callable[[], np.ndarray], transposed: bool = True) -> str:
        """A weight made of model tensors ``parts`` concatenated on their first axis (``transposed``:
        then transposed, as MatMul takes a Linear's weight): pointed at where the data file's
        checkpoint holds them side by side (a Transpose node over them where ``transposed``),
        else ``make()`` written as :meth:`const` writes it."""
        tensor = onnx.TensorProto(name=name + TRANSPOSED_SUFFIX if transposed else name)
        if self.data is None or self.data.refer(tensor, parts) is None:
            return self.const(name, make())
        self.model.graph.initializer.append(tensor)
        if transposed:
            self.nodes.append(helper.make_node("Transpose", [tensor.name], [name], perm=[1, 0],
                                               name=f"{name}/from_checkpoint"))  # fmt: skip
        self._names.add(name)
        return name

    def scalar(self, value: float | int) -> str:
        """A scalar constant (float32, or int64 for an int), one initializer per value."""
        array = np.array(value, np.int64 if isinstance(value, int) else np.float32)
        name = f"scalar_{array.dtype}_{value!r}"
        if name not in self._names:
            self.const(name, array)
        return name

    def op(self, op_type: str, inputs: list[str], name: str | None = None, outputs: int | list[str] = 1,
           **attrs: object) -> str | list[str]:  # fmt: skip
        """One node; ``outputs`` is how many (named after ``name``) or their names."""
        self._count += 1
        base = name or f"{op_type.lower()}_{self._count}"
        if isinstance(outputs, list):
            outs = outputs
        else:
            outs = [base] if outputs == 1 else [f"{base}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"n{self._count}_{op_type}", **attrs))
        return outs[0] if outputs == 1 else outs

    def __call__(self, op_type: str, *inputs: str, name: str | None = None, **attrs: object) -> str:
        out = self.op(op_type, list(inputs), name=name, **attrs)
        assert isinstance(out, str)
        return out


#: the names of each layer's matrix products (their weights are ``layers.<i>.<name>.weight.T``)
QKV, OUT, GATE_UP, UP, DOWN = "attn.qkv_proj", "attn.o_proj", "ff.gate_up_proj", "ff.up_proj", "ff.down_proj"
#: a mixture of experts' router product, and its experts' stacked weights (``layers.<i>.<name>``)
ROUTER, EXPERTS_IN, EXPERTS_OUT = "ff.router", "ff.experts_in", "ff.experts_out"


def product_weight(layer: int, product: str) -> str:
    """The name of layer ``layer``'s ``product`` weight in the graph."""
    return f"layers.{layer}.{product}.weight.T"


def layer_products(layer: object) -> dict[str, list[object]]:
    """One layer's matrix products in the order its forward runs them, each the projections it
    packs side by side (their outputs concatenated; every one reads the same input); a mixture of
    experts' router (its experts are not products of one matrix)."""
    attn, ff = layer.attn, layer.ff  # type: ignore[attr-defined]
    if isinstance(ff, Experts):
        return {QKV: [attn.q_proj, attn.k_proj, attn.v_proj], OUT: [attn.o_proj], ROUTER: [ff.router]}
    feed = {GATE_UP: [ff.gate_proj, ff.up_proj]} if ff.gated else {UP: [ff.up_proj]}
    return {QKV: [attn.q_proj, attn.k_proj, attn.v_proj], OUT: [attn.o_proj], **feed, DOWN: [ff.down_proj]}


def _weight(module: object, name: str) -> np.ndarray:
    return getattr(module, name).detach().float().numpy()


#: The fused form's bias on padding slots: its exp is 0 in float32 and float16 alike, and float16
#: holds it (the fp16 conversion keeps in float32 whatever comes near float16's range, and
#: GroupQueryAttention takes its bias in its query's type)
PAD_BIAS = -4096.0


def build_causal_decoder(model: CausalLM, spec: GraphSpec, fused: bool = False, data: DataSink | None = None
                         ) -> onnx.ModelProto:  # fmt: skip
    """The ``causal_decoder`` graph of ``model`` with ``spec``'s inputs and outputs; ``fused``: its
    attention as ONNX Runtime's ``GroupQueryAttention`` (heads of a multiple of 16 values);
    ``data``: its weights written to that external data file as they are made."""
    c = model.lm
    d, heads, kv, dim = c.d_model, c.n_heads, c.n_kv_heads, c.dim
    group = heads // kv
    g = _Builder(data)
    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    one, zero = g.const("axes_1", i64(1)), g.const("axes_0", i64(0))  # 1-D: axes of Unsqueeze / Squeeze
    s0, s1 = g.scalar(0), g.scalar(1)

    # ------------------------------------------------------------- once for all layers
    batch = g("Gather", g("Shape", "input_ids"), s0, axis=0)  # scalars
    new = g("Gather", g("Shape", "input_ids"), s1, axis=0)
    slots = g("Gather", g("Shape", "attention_mask"), s1, axis=0)
    position = g("Squeeze", "position", zero)
    low = float(np.finfo(np.float32).min)
    windows = sorted({c.window(i) for i in range(c.n_layers)})

    def near(window: int, slot_mask: str) -> str:
        """(B, T, S): whether each slot of ``slot_mask`` (B, S) lies less than ``window`` real tokens
        before each new token (counted by the mask's running sum, as the eager model counts)."""
        slot_positions = g("Sub", g("CumSum", g("Cast", slot_mask, to=TensorProto.INT64), s1), s1)  # (B, S)
        query_positions = g("Slice", slot_positions, g("Unsqueeze", position, zero),
                            g("Unsqueeze", g("Add", position, new), zero), one)  # (B, T)  # fmt: skip
        back = g("Sub", g("Unsqueeze", query_positions, g.const("axes_2", i64(2))), g("Unsqueeze", slot_positions, one))
        return g("Less", back, g.scalar(window))

    if fused:  # GroupQueryAttention's own inputs: every row's length, and the padding as a bias
        total = g("Add", position, new)  # scalar: slots 0 .. total - 1 are read
        rows = g("Unsqueeze", batch, zero)
        seqlens = g("Expand", g("Cast", g("Sub", total, s1), to=TensorProto.INT32), rows)  # (B,)
        query_lens = g("Expand", g("Cast", new, to=TensorProto.INT32), rows)
        total32 = g("Cast", total, to=TensorProto.INT32)
        read = g("Slice", "attention_mask", zero, g("Unsqueeze", total, zero), one)  # (B, total)
        real = g("Cast", read, to=TensorProto.BOOL)
        pad_bias = g("Where", real, g.scalar(0.0), g.scalar(PAD_BIAS))
        bias_shape = g("Concat", rows, g.const("one1", i64(1)), g("Unsqueeze", new, zero),
                       g("Unsqueeze", total, zero), axis=0)  # fmt: skip
        pad_bias = g("Expand", g("Unsqueeze", pad_bias, g.const("axes_12", i64(1, 2))), bias_shape)  # (B, 1, T, total)
        biases = {0: pad_bias}
        for window in set(windows) - {0}:  # the window's limit as a bias too: padding may sit inside it
            seen = g("And", g("Unsqueeze", real, one), near(window, read))  # (B, T, total)
            biases[window] = g("Unsqueeze", g("Where", seen, g.scalar(0.0), g.scalar(PAD_BIAS)), one)
    else:
        query_slot = g("Add", g("Range", s0, new, s1), position)  # (T,): the slot each new token is written to
        causal = g("LessOrEqual", g("Unsqueeze", g("Range", s0, slots, s1), zero),
                   g("Unsqueeze", query_slot, one))  # (T, C)  # fmt: skip
        allowed = g("And", g("Unsqueeze", causal, zero),
                    g("Cast", g("Unsqueeze", "attention_mask", one), to=TensorProto.BOOL))  # (B, T, C)  # fmt: skip
        masks = {}
        tile = g.const("mask_tile", i64(1, 1, group, 1)) if group > 1 else ""
        for window in windows:
            seen = allowed if not window else g("And", allowed, near(window, "attention_mask"))
            mask = g("Unsqueeze", g("Where", seen, g.scalar(0.0), g.scalar(low)), one)  # (B, 1, T, C)
            if group > 1:  # rows of a key/value head's queries: group-major, then tokens
                mask = g("Tile", mask, tile)
            masks[window] = mask
        # the cache write's (row, head, slot) indices, laid out (B, T, KV, 3) as the new keys are
        target = g("Concat", g("Unsqueeze", batch, zero), g("Unsqueeze", new, zero), g.const("kv_heads", i64(kv)),
                   g.const("last1", i64(1)), axis=0)  # fmt: skip
        row_index = g("Expand", g("Reshape", g("Range", s0, batch, s1), g.const("rows_shape", i64(-1, 1, 1, 1))),
                      target)  # fmt: skip
        head_index = g("Expand", g.const("head_index", np.arange(kv, dtype=np.int64).reshape(1, 1, kv, 1)), target)
        slot_index = g("Expand", g("Reshape", query_slot, g.const("slots_shape", i64(1, -1, 1, 1))), target)
        write_at = g("Concat", row_index, head_index, slot_index, axis=3)

    embed = g.weight("embed.weight", [model.embed.weight], lambda: _weight(model.embed, "weight"), transposed=False)
    x = g("Gather", embed, "input_ids", axis=0)  # (B, T, d)
    if c.embed_scale != 1.0:
        x = g("Mul", x, g.scalar(float(np.float32(c.embed_scale))))
    if c.position == "learned":
        x = g("Add", x, g("Gather", g.const("pos_embed.weight", _weight(model.pos_embed, "weight")), "position_ids"))
    tables: dict[str | None, tuple[str, str, int] | None] = {None: None}  # rotation kind -> (cos, sin, rotary dims)
    if c.position == "rope":
        # the cos and sin of positions 0 .. max(capacity, the largest position fed), made at each
        # call (a table of the model's whole context weighs 2 to 8 MB on disk)
        reach = g("Max", slots, g("Add", g("ReduceMax", "position_ids", keepdims=0), s1))
        angles = g("Unsqueeze", g("Cast", g("Range", s0, reach, s1), to=TensorProto.FLOAT), one)
        for kind in {c.rope_of(i) for i in range(c.n_layers)} - {None}:
            suffix, inv, factor = ("", model.inv_freq, model.rope_factor) if kind == "global" else \
                ("_local", model.inv_freq_local, 1.0)  # fmt: skip
            angle = g("Mul", angles, g.const(f"rope_inv_freq{suffix}", inv.float().numpy()[None]))  # (C, rotary / 2)
            cos, sin = g("Cos", angle), g("Sin", angle)
            if factor != 1.0:  # YaRN's and LongRoPE's attention factor
                scaled = g.const("rope_factor", np.array([factor], dtype=np.float32))
                cos, sin = g("Mul", cos, scaled), g("Mul", sin, scaled)
            tables[kind] = (cos, sin, 2 * int(inv.numel()))
    scale = c.scale

    def linear(x: str, module: object, prefix: str) -> str:
        return packed(x, [module], prefix)

    def packed(x: str, modules: list[object], prefix: str, scales: tuple[float, ...] = ()) -> str:
        """One product for several projections of the same input (their weights side by side, each
        times its ``scales`` entry): fewer, wider matrix products, which the CPU runs nearer its
        memory bandwidth."""
        scales = scales or (1.0,) * len(modules)

        def weight() -> np.ndarray:
            return np.concatenate([_weight(m, "weight") * s for m, s in zip(modules, scales, strict=True)], axis=0).T

        name = f"{prefix}.weight.T"
        if all(s == 1.0 for s in scales):  # the checkpoint's own bytes, where it holds them side by side
            out = g("MatMul", x, g.weight(name, [m.weight for m in modules], weight))
        else:
            out = g("MatMul", x, g.const(name, weight()))
        if getattr(modules[0], "bias", None) is not None:
            biases = [_weight(m, "bias") * s for m, s in zip(modules, scales, strict=True)]
            out = g("Add", out, g.const(f"{prefix}.bias", np.concatenate(biases)))
        return out

    def norm(x: str, module: object, prefix: str) -> str:
        w = g.const(f"{prefix}.weight", _weight(module, "weight"))
        if c.norm == "layernorm":
            return g("LayerNormalization", x, w, g.const(f"{prefix}.bias", _weight(module, "bias")), axis=-1,
                     epsilon=c.norm_eps)  # fmt: skip
        return rms(x, w)

    def rms(x: str, w: str) -> str:
        var = g("ReduceMean", g("Pow", x, g.scalar(2.0)), axes=[-1], keepdims=1)
        root = g("Sqrt", g("Add", var, g.scalar(c.norm_eps)))
        return g("Mul", g("Div", x, root), w)

    def activation(x: str) -> str:
        if c.activation == "silu":
            return g("Mul", x, g("Sigmoid", x))
        if c.activation == "gelu":
            inner = g("Erf", g("Div", x, g.scalar(math.sqrt(2.0))))
            return g("Mul", g("Mul", x, g.scalar(0.5)), g("Add", inner, g.scalar(1.0)))
        cube = g("Mul", g("Mul", x, x), x)  # gelu_tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        inner = g("Mul", g("Add", x, g("Mul", cube, g.scalar(0.044715))), g.scalar(math.sqrt(2.0 / math.pi)))
        return g("Mul", g("Mul", x, g.scalar(0.5)), g("Add", g("Tanh", inner), g.scalar(1.0)))

    split_q, split_kv = g.const("split_q", i64(0, 0, heads, dim)), g.const("split_kv", i64(0, 0, kv, dim))
    if c.qk_norm:  # each head's q/k norm works on (B, T, heads, D): back to (B, T, heads * D) after it
        flat_q, flat_kv = g.const("flat_q", i64(0, 0, heads * dim)), g.const("flat_kv", i64(0, 0, kv * dim))
    by_kv_head = g.const("by_kv_head", i64(0, kv, -1, dim))
    by_head = g.const("by_head", i64(0, heads, -1, dim))
    merge = g.const("merge_heads", i64(0, 0, heads * dim))
    qkv_sizes = g.const("qkv_sizes", i64(heads * dim, kv * dim, kv * dim))
    ff_sizes = g.const("ff_sizes", i64(c.d_ff, c.d_ff))

    def add_norm(x: str, branch: str | None, module: object, prefix: str) -> tuple[str, str]:
        """(the norm of x + branch, x + branch); a branch of None adds nothing."""
        x = x if branch is None else g("Add", x, branch)
        return norm(x, module, prefix), x

    if c.n_experts:  # made once for every mixture-of-experts layer
        flat_tokens, top_k = g.const("flat_tokens", i64(-1, d)), g.const("experts_k", i64(c.experts_per_token))
        expert_sizes, last, axis2 = (g.const("expert_sizes", i64(c.expert_d_ff, c.expert_d_ff)),
                                     g.const("axes_last", i64(-1)), g.const("axes_2b", i64(2)))  # fmt: skip

    def experts(h: str, ff: Experts, p: str) -> str:
        """A mixture of experts on the normed ``h``: ONNX Runtime's ``MoE`` in the fused form (its
        SwiGLU reads gate and up interleaved), else every expert's product over every token, summed
        by the routing weights (zero off a token's top k) in standard operators."""
        flat = g("Reshape", h, flat_tokens)  # (N, d)
        logits = linear(flat, ff.router, f"{p}.{ROUTER}")  # (N, E)
        gate, up, down = (_weight(ff, n) for n in ("gate_proj", "up_proj", "down_proj"))
        if fused and c.activation == "silu":
            fc1 = np.stack([gate, up], axis=2).reshape(c.n_experts, 2 * c.expert_d_ff, d)  # g0, u0, g1, u1, ...
            out = g.op("MoE", [flat, logits, g.const(f"{p}.{EXPERTS_IN}", fc1), "",
                               g.const(f"{p}.{EXPERTS_OUT}", down), ""], domain="com.microsoft",
                       k=c.experts_per_token, activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0,
                       activation_beta=0.0, normalize_routing_weights=int(c.norm_topk))  # fmt: skip
        else:
            top, chosen = g.op("TopK", [g("Softmax", logits, axis=-1), top_k], outputs=2, axis=-1)
            if c.norm_topk:
                top = g("Div", top, g("ReduceSum", top, last, keepdims=1))
            routed = g("ScatterElements", g("Mul", logits, g.scalar(0.0)), chosen, top, axis=-1)  # (N, E)
            fc1 = np.concatenate([gate, up], axis=1).transpose(0, 2, 1)  # (E, d, 2 * width)
            both = g("MatMul", g("Unsqueeze", flat, zero), g.const(f"{p}.{EXPERTS_IN}", fc1))  # (E, N, 2 * width)
            gated, upped = g.op("Split", [both, expert_sizes], outputs=2, axis=-1)
            each = g("MatMul", g("Mul", activation(gated), upped),
                     g.const(f"{p}.{EXPERTS_OUT}", down.transpose(0, 2, 1)))  # (E, N, d)  # fmt: skip
            weights = g("Unsqueeze", g("Transpose", routed, perm=[1, 0]), axis2)  # (E, N, 1)
            out = g("ReduceSum", g("Mul", each, weights), zero, keepdims=0)
        return g("Reshape", out, g("Shape", h))

    def feed_forward(h: str, layer: object, p: str) -> str:
        """The feed-forward branch of the normed ``h``."""
        ff = layer.ff
        if isinstance(ff, Experts):
            return experts(h, ff, p)
        if c.gated:
            gate, up = g.op("Split", [packed(h, [ff.gate_proj, ff.up_proj], f"{p}.{GATE_UP}"), ff_sizes],
                            outputs=2, axis=-1)  # fmt: skip
            inner = g("Mul", activation(gate), up)
        else:
            inner = activation(linear(h, ff.up_proj, f"{p}.{UP}"))
        return linear(inner, ff.down_proj, f"{p}.{DOWN}")

    # GroupQueryAttention rotates queries and keys itself where the rotation spans the head (and the
    # head is a multiple of 16 values, which its CPU kernel's rotation requires)
    def rotate_inside(table: tuple[str, str, int] | None) -> bool:
        return fused and table is not None and table[2] == dim and dim % 16 == 0

    def split_heads(qkv: str, attn: object, p: str, table: tuple[str, str, int] | None,
                    q_norm_scale: float) -> tuple[str, str, str]:  # fmt: skip
        """q, k, v (B, T, heads * D) of the packed product: each head's q/k norm (the queries'
        weight times ``q_norm_scale``), then the rotation by ``table`` where one is given."""
        q, k, v = g.op("Split", [qkv, qkv_sizes], outputs=3, axis=-1)
        if c.qk_norm:  # each head's own norm, then back to (B, T, heads * D) for the rotation
            q = g("Reshape", rms(g("Reshape", q, split_q), g.const(f"{p}.attn.q_norm.weight",
                                 _weight(attn.q_norm, "weight") * q_norm_scale)), flat_q)  # fmt: skip
            k = g("Reshape", rms(g("Reshape", k, split_kv), g.const(f"{p}.attn.k_norm.weight",
                                 _weight(attn.k_norm, "weight"))), flat_kv)  # fmt: skip
        if table is not None:
            cos_t, sin_t, rotary = table
            q, k = (g.op("RotaryEmbedding", [t, "position_ids", cos_t, sin_t], domain="com.microsoft",
                         interleaved=int(c.rope_layout == "interleaved"), rotary_embedding_dim=rotary,
                         num_heads=n)  # fmt: skip
                    for t, n in ((q, heads), (k, kv)))
        return q, k, v

    def gqa(i: int, qkv: str, attn: object, p: str) -> str:
        """ONNX Runtime's GroupQueryAttention over the slot cache, written in place: packed q/k/v in,
        its rotation fused where it can take it."""
        inputs, rope = [qkv, "", ""], ["", "", ""]
        attrs: dict[str, object] = {"num_heads": heads, "kv_num_heads": kv}
        if c.attn_scale:
            attrs["scale"] = c.attn_scale
        if c.attn_softcap:
            attrs["softcap"] = c.attn_softcap
        table = tables[c.rope_of(i)]
        inside = rotate_inside(table)
        # the CPU kernel has no q/k norm of its own (onnxruntime 1.32: CUDA and WebGPU only)
        if c.qk_norm or (table is not None and not inside):
            inputs = list(split_heads(qkv, attn, p, None if inside else table, q_norm_scale=1.0))
        if inside:
            assert table is not None
            rope = [table[0], table[1], "position_ids"]
            attrs.update(do_rotary=1, rotary_interleaved=int(c.rope_layout == "interleaved"))
        outs = g.op("GroupQueryAttention", [*inputs, f"cache_key_{i}", f"cache_value_{i}", seqlens, total32, *rope,
                    biases[c.window(i)], "", "", "", "", "", query_lens], domain="com.microsoft",
                    outputs=[f"attention_{i}", f"updated_key_{i}", f"updated_value_{i}"], **attrs)  # fmt: skip
        return outs[0]

    def attention(i: int, qkv: str, attn: object, p: str) -> str:
        """Self-attention over the slot cache in standard operators, the cache written by ScatterND."""
        q, k, v = split_heads(qkv, attn, p, tables[c.rope_of(i)], q_norm_scale=scale)
        q = g("Transpose", g("Reshape", q, split_q), perm=[0, 2, 1, 3])  # (B, H, T, D)
        # keys and values stay (B, T, KV, D): the cache write's indices are laid out to match
        k, v = g("Reshape", k, split_kv), g("Reshape", v, split_kv)
        keys = g("ScatterND", f"cache_key_{i}", write_at, k, name=f"updated_key_{i}")  # (B, KV, C, D)
        values = g("ScatterND", f"cache_value_{i}", write_at, v, name=f"updated_value_{i}")
        q = g("Reshape", q, by_kv_head)  # (B, KV, group * T, D)
        scores = g("MatMul", q, g("Transpose", keys, perm=[0, 1, 3, 2]))  # (B, KV, group * T, C), scaled
        if c.attn_softcap:
            scores = g("Mul", g("Tanh", g("Div", scores, g.scalar(c.attn_softcap))), g.scalar(c.attn_softcap))
        scores = g("Add", scores, masks[c.window(i)])
        out = g("Reshape", g("MatMul", g("Softmax", scores, axis=-1), values), by_head)  # (B, H, T, D)
        return g("Reshape", g("Transpose", out, perm=[0, 2, 1, 3]), merge)

    branch: str | None = None  # the residual branch not yet added to x
    from tqdm import tqdm

    layers = tqdm(model.layers, desc=f"writing {spec.name}", unit="layer", disable=None, leave=False)
    for i, layer in enumerate(layers):
        p = f"layers.{i}"
        attn = layer.attn
        h, x = add_norm(x, branch, layer.norm1, f"{p}.norm1")
        # 1 / sqrt(D) folded into the queries' projection (or their norm's weight): rotation is linear
        q_scale = (1.0,) if c.qk_norm or fused else (scale,)
        qkv = packed(h, [attn.q_proj, attn.k_proj, attn.v_proj], f"{p}.{QKV}", (*q_scale, 1.0, 1.0))
        out = linear(gqa(i, qkv, attn, p) if fused else attention(i, qkv, attn, p), attn.o_proj, f"{p}.{OUT}")
        if c.sandwich_norm:
            out = norm(out, layer.attn_out_norm, f"{p}.attn_out_norm")
        h, x = add_norm(x, out, layer.norm2, f"{p}.norm2")
        branch = feed_forward(h, layer, p)
        if c.sandwich_norm:
            branch = norm(branch, layer.ff_out_norm, f"{p}.ff_out_norm")

    picked = g("Expand", g("Unsqueeze", "logits_at", g.const("axis_last", i64(2))),
               g("Concat", g("Shape", "logits_at"), g.const("width", i64(d)), axis=0))  # (B, N, d)  # fmt: skip
    x = norm(g("GatherElements", g("Add", x, branch), picked, axis=1), model.norm, "norm")
    head = g.weight("lm_head.weight.T", [model.lm_head.weight], lambda: _weight(model.lm_head, "weight").T)
    if c.logit_softcap:
        cap = g.scalar(c.logit_softcap)
        g.op("Mul", [g("Tanh", g("Div", g("MatMul", x, head), cap)), cap], name="logits")
    else:
        g.op("MatMul", [x, head], name="logits")

    def value(t: object) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(t.name, _ONNX_TYPE[t.dtype], list(t.axes))  # type: ignore[attr-defined]

    proto = g.model  # filled in place: make_graph and make_model would copy every weight twice
    proto.ir_version = 8
    proto.opset_import.extend([helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])
    proto.graph.name = spec.name
    proto.graph.node.extend(g.nodes)
    proto.graph.input.extend(value(t) for t in spec.inputs)
    proto.graph.output.extend(value(t) for t in spec.outputs)
    return proto
