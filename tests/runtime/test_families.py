"""The family registry: every family is one record whose references resolve, graph names mean one
thing across families, and the runtime reads graph specs from the manifest."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from edgeattn.config import ModelConfig
from edgeattn.errors import ConfigError
from edgeattn.runtime.families import FAMILIES, all_graph_names, all_tasks, family_of, resolve, resolve_graphs
from edgeattn.runtime.manifest import ManifestError

pytestmark = pytest.mark.quick

SEQ2SEQ = ModelConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                      max_len=32, dropout=0.0)  # fmt: skip
ENCODER = SEQ2SEQ.replace(architecture="encoder", n_decoder_layers=0, head="sequence", num_labels=3)


def test_every_reference_of_every_family_resolves():
    for family in FAMILIES.values():
        for ref in (family.model, family.runtime, *([family.stepper] if family.stepper else [])):
            assert resolve(ref) is not None, ref
        for role in family.roles:
            for ref in (role.module, role.calibration, role.gate):
                assert ref is None and role.name in family.ungated or callable(resolve(ref)), ref
            assert set(role.needs) <= set(family.graphs), role.name
        for task, graphs in family.tasks.items():
            assert set(graphs) <= set(family.graphs), task
        assert set(family.generation) <= set(family.graphs)


def test_a_graph_name_means_one_graph_in_every_family():
    """Roles of one name are one graph: the same spec and module, or (the speech decoder, which
    also returns its alignment heads' weights) the same inputs and outputs with outputs after
    them, from a subclass of the module."""
    from edgeattn.families.speech.config import SpeechConfig

    speech = SEQ2SEQ.replace(architecture="speech-to-text", section=SpeechConfig(alignment_heads=((0, 1),)))
    seen = {}
    for family in FAMILIES.values():
        for role in family.roles:
            if role.name in seen:
                other = seen[role.name]
                if (role.spec, role.module) != (other.spec, other.module):
                    assert issubclass(resolve(role.module), resolve(other.module)), role.name
                    extended, base = role.spec(speech), other.spec(speech)
                    assert extended.inputs == base.inputs, role.name
                    assert extended.outputs[: len(base.outputs)] == base.outputs, role.name
                    assert extended.outputs != base.outputs, role.name
                assert None in (role.gate, other.gate) or role.gate == other.gate, role.name
            seen[role.name] = role
    assert len(set(all_tasks())) == sum(len(f.tasks) for f in FAMILIES.values())  # a task is one family's


def test_the_family_of_a_config_decides_its_graphs():
    assert family_of(SEQ2SEQ).name == "seq2seq" and family_of(ENCODER).name == "encoder"
    assert resolve_graphs(None, ENCODER) == ["attention", "encoder"]
    assert resolve_graphs(["decoder_fixed"], SEQ2SEQ) == ["encoder", "cross_kv", "decoder", "decoder_fixed"]
    with pytest.raises(ConfigError, match="needs an encoder-decoder model"):
        resolve_graphs(["decoder"], ENCODER)
    with pytest.raises(ConfigError, match="unknown graph 'bogus'; choose from attention, encoder, decoder"):
        resolve_graphs(["bogus"], ENCODER)
    assert "cross_kv" in all_graph_names()


def test_verification_never_runs_a_traced_size():
    from edgeattn.families.causal.config import CausalLMConfig
    from edgeattn.families.speech.config import SpeechConfig
    from edgeattn.families.vision.config import VisionConfig
    from edgeattn.runtime.specs import EXPORT_SIZES

    vision = ModelConfig(architecture="vision", vocab_size=1, pad_id=0, bos_id=0, eos_id=0, norm_first=True,
                         position="none", section=VisionConfig(image_size=64, patch_size=16))  # fmt: skip
    configs = {"vision": vision, "encoder": ENCODER.replace(max_len=64), "seq2seq": SEQ2SEQ.replace(max_len=64),
               "causal": CausalLMConfig(max_len=64).model_config(),
               "speech": SEQ2SEQ.replace(architecture="speech-to-text", max_len=64, section=SpeechConfig(80, 100))}
    for family in FAMILIES.values():
        for role in family.roles:
            if role.applies is not None and not role.applies(configs[family.name]):
                continue
            for sizes in role.sizes(configs[family.name]):
                assert sizes.get("src_len") != EXPORT_SIZES["src_len"] or sizes.get("batch") != EXPORT_SIZES["batch"]
                assert (sizes.get("height"), sizes.get("width")) != (EXPORT_SIZES["height"], EXPORT_SIZES["width"])


@pytest.fixture(scope="module")
def encoder_export(tmp_path_factory):
    from edgeattn.exporters.export import export_model
    from edgeattn.model import build_model

    out = tmp_path_factory.mktemp("family") / "enc"
    export_model(build_model(ENCODER, seed=0), out, graphs=["encoder"], verify=False)
    return out


def test_the_manifest_records_the_family_and_load_returns_its_runtime(encoder_export):
    from edgeattn.runtime import load
    from edgeattn.runtime.families.encoder.runtime import EncoderRuntime

    assert json.loads((encoder_export / "manifest.json").read_text())["family"] == "encoder"
    model = load(encoder_export)
    assert isinstance(model, EncoderRuntime) and model.specs["encoder"].output_names == ["last_hidden_state", "logits"]
    with pytest.raises(AttributeError, match=r"generate\(\) is for seq2seq exports"):
        model.generate  # noqa: B018


def _changed(src, dst, graph_change, spec_change):
    """A copy of the export whose encoder graph and manifest spec are changed as a newer edgeattn
    might write them (the file's hash and size recorded again)."""
    import onnx

    from edgeattn.runtime.manifest import sha256_file

    shutil.copytree(src, dst)
    path = dst / "encoder.onnx"
    proto = onnx.load(str(path), load_external_data=False)
    graph_change(proto.graph)
    onnx.save(proto, str(path))
    data = json.loads((dst / "manifest.json").read_text())
    entry = data["graphs"]["encoder"]
    spec_change(entry)
    entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    (dst / "manifest.json").write_text(json.dumps(data))
    return dst


def test_a_stored_spec_with_an_output_this_version_does_not_list_still_loads(encoder_export, tmp_path):
    from onnx import TensorProto, helper

    from edgeattn.runtime import load

    def add_output(graph):
        graph.node.append(helper.make_node("Identity", ["logits"], ["logits_copy"]))
        graph.output.append(helper.make_tensor_value_info("logits_copy", TensorProto.FLOAT, ["batch", 3]))

    extra = {"name": "logits_copy", "dtype": "float32", "shape": ["batch", 3]}
    newer = _changed(encoder_export, tmp_path / "newer", add_output, lambda g: g["outputs"].append(extra))
    model = load(newer)
    assert model.specs["encoder"].output_names == ["last_hidden_state", "logits", "logits_copy"]
    ids = np.array([[3, 4, 5]])
    out = model.run("encoder", model.encoder_feeds(ids))
    np.testing.assert_array_equal(out["logits_copy"], out["logits"])
    np.testing.assert_allclose(model.classify(ids), load(encoder_export).classify(ids), atol=1e-6)
    missing = _changed(encoder_export, tmp_path / "missing", lambda g: None, lambda g: g["outputs"].pop())
    with pytest.raises(ManifestError, match="lacks the output logits"):
        load(missing).classify(ids)


def test_every_hugging_face_importer_names_a_family_and_a_task_of_it():
    from edgeattn.hf import IMPORTERS

    for name, importer in IMPORTERS.items():
        assert importer.architecture == name and importer.family in FAMILIES, name
        assert importer.task in FAMILIES[importer.family].tasks or importer.task == "encode", name


def test_a_manifest_whose_family_contradicts_its_config_is_refused(encoder_export, tmp_path):
    from edgeattn.runtime import load

    wrong = tmp_path / "wrong"
    shutil.copytree(encoder_export, wrong)
    data = json.loads((wrong / "manifest.json").read_text())
    data["family"] = "seq2seq"
    (wrong / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="says family 'seq2seq' but its config's architecture 'encoder'"):
        load(wrong)
