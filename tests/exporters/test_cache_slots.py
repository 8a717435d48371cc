"""The fixed-capacity self-attention cache (``CacheSlots``, the ``decoder_fixed`` graph): the same
logits as the growing cache, written in place by the runtime, refused where it cannot be."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from edgeattn.attention import CacheSlots
from edgeattn.config import ModelConfig
from edgeattn.errors import EdgeattnError, ExportError
from edgeattn.exporters.cache_writes import check_cache_writes
from edgeattn.exporters.export import export_model
from edgeattn.model import build_model
from edgeattn.runtime import load
from edgeattn.runtime.cross_decoding import SlotStepper
from edgeattn.runtime.specs import graph_spec

pytestmark = pytest.mark.quick

BASE = ModelConfig(
    vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, max_len=64, dropout=0.0
)
POSITIONS = {
    "sinusoidal": {},
    "learned": {"position": "learned"},
    "shaw": {"position": "relative", "relative_clip": 3},
    "t5": {"position": "t5", "norm": "rmsnorm", "norm_first": True, "attention_scaled": False, "bias": False},
    "topk": {"attention_topk": 0.5},
}


@pytest.mark.parametrize("variant", list(POSITIONS))
def test_slots_give_the_growing_caches_logits(variant):
    """Decoding in chunks of 1, 3 and 2 tokens: slots (unwritten ones full of noise) against concatenation."""
    model = build_model(BASE.replace(**POSITIONS[variant]), seed=3).eval()
    c = model.config
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, c.vocab_size, (2, 7), generator=gen)
    src_mask = torch.ones_like(src)
    src_mask[1, 5:] = 0
    tgt = torch.randint(0, c.vocab_size, (2, 6), generator=gen)
    capacity = 9
    with torch.no_grad():
        cross = model.cross_kv(model.encode(src, src_mask))
        shape = (2, c.n_heads, capacity, c.head_dim)
        slots = [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
                 for _ in range(c.n_decoder_layers)]  # fmt: skip
        past = None
        start = 0
        for width in (1, 3, 2):
            chunk = tgt[:, start : start + width]
            want, past = model.decode(chunk, cross_kv=cross, memory_mask=src_mask, past=past)
            position = torch.tensor([start])
            got, slots = model.decode(chunk, cross_kv=cross, memory_mask=src_mask,
                                      past=[CacheSlots(k, v, position) for k, v in slots])  # fmt: skip
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            for (k, v), (pk, pv) in zip(slots, past, strict=True):
                end = start + width
                torch.testing.assert_close(k[:, :, :end], pk)
                torch.testing.assert_close(v[:, :, :end], pv)
            start += width


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("slots") / "out"
    model = build_model(BASE.replace(**POSITIONS["t5"]), seed=5)
    export_model(model, out, graphs=["decoder_fixed"])
    return out, model


@pytest.mark.parametrize("strategy, options", [("greedy", {}), ("beam", {"num_beams": 3}),
                                               ("sample", {"seed": 2, "top_k": 5})])  # fmt: skip
def test_generation_over_slots_equals_the_growing_cache(exported, strategy, options):
    out, _ = exported
    rt = load(out)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, BASE.vocab_size, size=(3, 11))
    mask = np.ones_like(ids)
    mask[2, 4:] = 0
    assert rt.cache_slots and rt.sessions.created == ["encoder"]  # asking builds no session
    slots = rt.generate(ids, mask, 14, strategy=strategy, eos_id=-1, **options)
    assert "decoder_fixed" in rt.sessions.created and "decoder" not in rt.sessions.created
    rt.cache_slots = False
    grown = rt.generate(ids, mask, 14, strategy=strategy, eos_id=-1, **options)
    assert "decoder" in rt.sessions.created
    np.testing.assert_array_equal(slots.tokens, grown.tokens)
    np.testing.assert_allclose(slots.scores, grown.scores, atol=1e-4)


def test_the_runtime_writes_the_cache_in_place_and_stops_when_full(exported):
    out, _ = exported
    rt = load(out)
    ids, mask = rt.check_source(np.array([[5, 6, 7, 8]]))
    stepper = rt.stepper(ids, mask, repeat=2, capacity=3)
    assert isinstance(stepper, SlotStepper)
    buffers = {name: array.ctypes.data for name, array in stepper.host.items()}
    stepper.step(np.array([0, 0]))
    for name, array in stepper.host.items():
        assert array.ctypes.data == buffers[name]  # the same memory, written by the session
        assert np.abs(array[:, :, 0]).sum() > 0 and not array[:, :, 1:].any()
    stepper.reorder(np.array([1, 1]))
    stepper.step(np.array([3, 4]))
    key = stepper.host["cache_key_0"]
    assert not np.array_equal(key[0, :, 1], key[1, :, 1]) and np.array_equal(key[0, :, 0], key[1, :, 0])
    stepper.step(np.array([1, 2]))
    with pytest.raises(EdgeattnError, match="cache is full: all 3 slots"):
        stepper.step(np.array([1, 2]))


def test_a_rewound_cache_repeats_its_step(exported):
    """Rewinding to a slot and stepping again gives that step's logits again (the paired step
    benchmark times one step this way); a slot outside the cache is refused."""
    out, _ = exported
    rt = load(out)
    ids, mask = rt.check_source(np.array([[5, 6, 7, 8], [9, 10, 11, 12]]))
    stepper = rt.stepper(ids, mask, capacity=4)
    stepper.step(np.array([0, 0]))
    first = stepper.step(np.array([3, 4])).copy()
    stepper.step(np.array([6, 7]))  # a later slot written, then masked again by the rewind
    stepper.rewind(1)
    np.testing.assert_allclose(stepper.step(np.array([3, 4])), first, atol=1e-6)
    assert stepper.position == 2
    with pytest.raises(EdgeattnError, match="outside the cache's 4 slots"):
        stepper.rewind(4)


def test_every_exported_slot_graph_passes_the_in_place_check(exported):
    out, model = exported
    spec = graph_spec("decoder_fixed", model.config)
    check_cache_writes(onnx.load(str(out / "decoder_fixed.onnx"), load_external_data=False), spec)
    graph = onnx.load(str(out / "decoder_fixed.onnx"), load_external_data=False).graph
    scatters = [n for n in graph.node if n.op_type == "ScatterND"]
    assert len(scatters) == 2 * model.config.n_decoder_layers
    assert {n.input[0] for n in scatters} == {i for i in spec.input_names if i.startswith("cache_")}


def test_a_graph_reading_the_cache_after_its_write_is_refused():
    spec = graph_spec("decoder_fixed", BASE.replace(n_decoder_layers=1))
    t = TensorProto.FLOAT
    nodes = [
        helper.make_node("ScatterND", ["cache_key_0", "idx", "new"], ["updated_key_0"], name="write"),
        helper.make_node("Identity", ["cache_value_0"], ["updated_value_0"], name="copy"),
        # reads the key cache but the write does not wait for it
        helper.make_node("ReduceSum", ["cache_key_0"], ["logits"], name="late", keepdims=1),
    ]
    value = [helper.make_tensor_value_info(n, t, None) for n in ("cache_key_0", "cache_value_0", "new")]
    outs = [helper.make_tensor_value_info(n, t, None) for n in ("logits", "updated_key_0", "updated_value_0")]
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, None)
    proto = helper.make_model(helper.make_graph(nodes, "g", [*value, idx], outs))
    with pytest.raises(ExportError, match="ReduceSum node 'late' reads cache_key_0"):
        check_cache_writes(proto, spec)
    proto.graph.node[2].op_type = "Shape"  # reads the shape alone: harmless
    check_cache_writes(proto, spec)
    del proto.graph.node[2]
    check_cache_writes(proto, spec)
