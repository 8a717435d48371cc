"""T5 checkpoints from local Hugging Face folders: both layouts (the original: ReLU, tied output
layer; v1.1 / Flan-T5: gated GELU, separate output layer) against ``transformers`` eager, through
the exported graphs, greedy and beam search, text in and out, and the precisions' hard cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.exporters.export import export_model
from edgeattn.hf import import_folder
from edgeattn.runtime import load
from edgeattn.sources import resolve_model
from tests.helpers.t5_folders import (
    T5_CORPUS,
    export_variant,
    overflowing_t5,
    t5_batch,
    t5_checkpoint,
    t5_folder,
)

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

LAYOUTS = ("t5", "v1.1")


@pytest.fixture(scope="module", params=LAYOUTS)
def exported(request, tmp_path_factory):
    """(layout, transformers model, its tokenizer, the fp32 export loaded) per layout."""
    root = tmp_path_factory.mktemp(f"t5-{request.param}")
    folder = t5_folder(root / "hf", request.param)
    source = resolve_model(from_hf=folder)
    export_model(source.model, root / "out", **source.export_fields())
    reference = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return request.param, reference, tokenizer, load(root / "out", providers=["CPUExecutionProvider"])


# ----------------------------------------------------------------------------- the mapping
@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
def test_import_maps_both_layouts(tmp_path, layout):
    hf = import_folder(t5_folder(tmp_path / "hf", layout, layers=2, decoder_layers=3))
    c = hf.model.config
    assert hf.task == "generate" and hf.tokenizer is not None
    assert (c.n_encoder_layers, c.n_decoder_layers, c.head_dim, c.d_model) == (2, 3, 8, 32)  # 3 heads of 8 over 32
    assert c.tie_embeddings == c.scale_decoder_output == (layout == "t5")
    assert c.activation == ("relu" if layout == "t5" else "gated-gelu_tanh")
    assert (c.bos_id, c.eos_id, c.pad_id, c.attention_scaled, c.norm) == (0, 1, 0, False, "rmsnorm")
    enc = hf.model.encoder.layers
    assert enc[1].self_attn.relative is enc[0].self_attn.relative  # one table per stack
    assert hf.model.decoder.layers[0].cross_attn.relative is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager_matches_transformers_with_more_decoder_layers(tmp_path, layout):
    folder = t5_folder(tmp_path / "hf", layout, layers=2, decoder_layers=3)
    ours = import_folder(folder).model
    ref = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    ids, mask = (torch.tensor(a) for a in t5_batch())
    target = torch.tensor([[0, 5, 9, 33], [0, 7, 7, 1], [0, 40, 2, 3]])
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, decoder_input_ids=target)
        memory = ours.encode(ids, mask)
        logits = ours.decode(target, memory=memory, memory_mask=mask)[0]
    m = mask.bool()
    assert (memory - want.encoder_last_hidden_state)[m].abs().max() < 1e-4
    assert (logits - want.logits).abs().max() < 1e-4


# --------------------------------------------------------------------- exported graphs
def test_exported_graphs_match_transformers(exported):
    _, ref, _, rt = exported
    ids, mask = t5_batch()
    target = np.array([[0, 5, 9, 33, 4], [0, 7, 7, 1, 0], [0, 40, 2, 3, 3]])
    with torch.no_grad():
        feeds = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": target}
        want = ref(**{k: torch.tensor(v) for k, v in feeds.items()})
    hidden = rt.encode(ids, mask)
    real = mask.astype(bool)
    assert np.abs(hidden - want.encoder_last_hidden_state.numpy())[real].max() < 1e-4
    stepper = rt.stepper(ids, mask)
    for t in range(target.shape[1]):  # one token at a time through the cache
        logits = stepper.step(target[:, t])
        assert np.abs(logits - want.logits[:, t].numpy()).max() < 1e-4, f"step {t}"


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_generation_is_token_identical_to_transformers(exported, strategy):
    layout, ref, _, rt = exported
    ids, mask = t5_batch()
    beams = {"num_beams": 3} if strategy == "beam" else {}
    with torch.no_grad():
        want = ref.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=12,
                            do_sample=False, num_beams=beams.get("num_beams", 1), early_stopping=False,
                            length_penalty=1.0)[:, 1:].numpy()  # fmt: skip
    got = rt.generate(ids, mask, max_new_tokens=12, strategy=strategy, **beams).tokens
    width = max(want.shape[1], got.shape[1])
    pad = [_after_eos_as_pad(np.pad(a, ((0, 0), (0, width - a.shape[1])))) for a in (want, got)]
    assert np.array_equal(*pad), f"{layout} {strategy}:\n{want}\n{got}"
    assert (want == 1).any(), "the test model should reach EOS"


def _after_eos_as_pad(tokens: np.ndarray) -> np.ndarray:
    """Rows with every token after the first EOS set to the pad id (transformers' beam search fills
    them with EOS)."""
    ended = np.cumsum(tokens == 1, axis=1) - (tokens == 1) > 0
    return np.where(ended, 0, tokens)


def test_text_in_and_out_and_streaming(exported):
    _, ref, tokenizer, rt = exported
    texts = T5_CORPUS[:3]
    batch = tokenizer(texts, return_tensors="pt", padding=True, return_token_type_ids=False)
    with torch.no_grad():
        want = ref.generate(**batch, max_new_tokens=10, do_sample=False, num_beams=1)
    answers = rt.generate_text(texts, max_new_tokens=10)
    assert answers == tokenizer.batch_decode(want, skip_special_tokens=True)
    pieces = list(rt.stream_text(texts[0], max_new_tokens=10))
    assert "".join(pieces) == answers[0] and len(pieces) > 1
    # stop strings end an answer before them, whole and streamed (the decoding core both families share)
    longest = max(answers, key=len)
    stop = longest[len(longest) // 2 :][:2]
    assert len(stop) == 2
    row = answers.index(longest)
    cut = rt.generate_text(texts, max_new_tokens=10, stop=[stop])
    assert cut[row] == longest[: longest.index(stop)]
    assert all(c == (a[: a.index(stop)] if stop in a else a) for c, a in zip(cut, answers, strict=True))
    assert "".join(rt.stream_text(texts[row], max_new_tokens=10, stop=[stop])) == cut[row]


def test_cli_runs_a_t5_export(exported, tmp_path):
    from click.testing import CliRunner

    from edgeattn.cli import cli

    _, _, _, rt = exported
    text = T5_CORPUS[1]
    beam = CliRunner().invoke(cli, ["run", str(rt.export_dir), text, "--strategy", "beam", "--beams", "3",
                                    "--max-new-tokens", "10"])  # fmt: skip
    assert beam.exit_code == 0, beam.output
    assert beam.output.strip() == rt.generate_text([text], 10, strategy="beam", num_beams=3)[0].strip()
    stream = CliRunner().invoke(cli, ["run", str(rt.export_dir), text, "--stream", "--max-new-tokens", "10"])
    assert stream.exit_code == 0 and stream.output.strip() == rt.generate_text([text], 10)[0].strip()
    # the issue's own command: beam search streamed as every beam agrees
    both = CliRunner().invoke(cli, ["run", str(rt.export_dir), text, "--strategy", "beam", "--beams", "3", "--stream",
                                    "--max-new-tokens", "10"])  # fmt: skip
    assert both.exit_code == 0 and both.output.strip() == beam.output.strip()
    pieces = list(rt.stream_text(text, max_new_tokens=10, strategy="beam", num_beams=3))
    assert "".join(pieces) == rt.generate_text([text], 10, strategy="beam", num_beams=3)[0]


# ---------------------------------------------------------------------------- bad folders
def _broken(tmp_path: Path, change: str) -> Path:
    folder = t5_folder(tmp_path / "hf", "v1.1")
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(folder / "model.safetensors")
    if change == "silu":
        config["feed_forward_proj"], config["dense_act_fn"] = "gated-silu", "silu"
    elif change == "no-lm-head":
        del tensors["lm_head.weight"]
    elif change == "stray":
        tensors["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = torch.zeros(8, 3)
    elif change == "shape":
        tensors["encoder.block.1.layer.0.SelfAttention.q.weight"] = torch.zeros(32, 32)
    elif change == "no-d_kv":
        del config["d_kv"]
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("silu", "feed_forward_proj 'gated-silu' with dense_act_fn 'silu' is not one of"),
        ("no-lm-head", "unties the output layer but the weights have no lm_head.weight"),
        ("stray", "does not use: decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"),
        ("shape", r"encoder.layers.1.self_attn.q_proj.weight has shape \(32, 32\), the model expects \(24, 32\)"),
        ("no-d_kv", "lacks 'd_kv'"),
    ],
)
@pytest.mark.quick
def test_bad_folders_fail_with_one_line(tmp_path, change, message):
    with pytest.raises((ConfigError, CheckpointError), match=message) as info:
        import_folder(_broken(tmp_path, change))
    assert "\n" not in str(info.value)


@pytest.mark.quick
def test_a_tied_output_layer_saved_apart_must_equal_the_embedding(tmp_path):
    folder = t5_folder(tmp_path / "hf", "t5")
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["shared.weight"].clone()
    save_file(tensors, str(folder / "model.safetensors"))
    import_folder(folder)  # equal: accepted
    tensors["lm_head.weight"][0, 0] += 1
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lm_head.weight .the output layer. differs from shared.weight"):
        import_folder(folder)


def _weight_types(path: Path, node_part: str) -> set[int]:
    """Element types of the initializers feeding the nodes whose name contains ``node_part``."""
    import onnx

    from edgeattn.exporters.compact import fold_transposes

    graph = fold_transposes(onnx.load(path)).graph
    types = {t.name: t.data_type for t in graph.initializer}
    return {types[i] for n in graph.node if node_part in n.name for i in n.input if i in types}


def test_fp16_keeps_what_passes_float16s_range_in_float32(tmp_path):
    """The feed-forward output (and the residual sums and squares after it) measured past float16's
    range stay float32; a plain float16 conversion makes them float16 (inf / NaN on the GPU, see
    test_cuda); edgeattn's fp16 stays finite and passes its gate."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from edgeattn.exporters.compact import fold_transposes
    from edgeattn.exporters.quantize import activation_peaks

    ids, mask = t5_batch()
    _, result, manifest = export_variant(tmp_path, overflowing_t5(), ["fp32-opt", "fp16"])
    source = tmp_path / "out" / manifest.entry("encoder", "fp32-opt").file
    peaks = activation_peaks(source, [{"input_ids": ids, "attention_mask": mask}])
    wo = "/encoder/layers.0/ff/linear2/MatMul"
    assert max(v for k, v in peaks.items() if k.startswith(wo)) > 65504  # the model does pass float16's range

    naive = tmp_path / "naive.onnx"
    onnx.save(convert_float_to_float16(fold_transposes(onnx.load(source)), keep_io_types=True), naive)
    assert _weight_types(naive, wo) == {onnx.TensorProto.FLOAT16}
    ours = tmp_path / "out" / manifest.entry("encoder", "fp16").file
    assert _weight_types(ours, wo) == {onnx.TensorProto.FLOAT}
    assert _weight_types(ours, "/encoder/layers.1/ff/linear2/MatMul") == {onnx.TensorProto.FLOAT16}  # the rest fp16

    assert result.gates["fp16"].passed
    kept = manifest.entry("encoder", "fp16").quantization["kept_float32_nodes"]
    assert wo in kept and manifest.entry("decoder", "fp16").quantization["kept_float32_nodes"] == []
    fp16 = load(tmp_path / "out", precision="fp16", providers=["CPUExecutionProvider"])
    fp32 = load(tmp_path / "out", providers=["CPUExecutionProvider"])
    assert np.isfinite(fp16.encode(ids, mask)).all()
    assert np.array_equal(fp16.greedy(ids, mask, 10), fp32.greedy(ids, mask, 10))


def _with_outlier(model, factor: float):
    """One feed-forward hidden channel of the second encoder layer ``factor`` times larger (its linear,
    gating projection scaled), the output projection's column divided back: the same function in
    float32, and the kind of outlier that makes a T5 v1.1 collapse when the input of its
    feed-forward output projection is quantised per tensor."""
    with torch.no_grad():
        ff = model.encoder.block[1].layer[1].DenseReluDense
        ff.wi_1.weight[5] *= factor
        ff.wo.weight[:, 5] /= factor
    return model


def test_int8_gate_catches_the_t5_feed_forward_outlier_and_keeps_it_float32(tmp_path):
    """The encoder graph alone (a random model's greedy tokens are too close to ties for the int8
    generation metric to say anything): without the outlier int8 passes as it is; with it, the gate
    catches the collapse and the sensitive-node search keeps that projection in float32."""
    from edgeattn.exporters.precision_builds import PrecisionOptions

    ids, mask = t5_batch()
    plain = t5_checkpoint("v1.1", std=0.1)
    _, result, manifest = export_variant(tmp_path / "plain", plain, ["int8"], graphs=["encoder"])
    excluded = manifest.entry("encoder", "int8").quantization["excluded_nodes"]
    assert result.gates["int8"].passed and not [n for n in excluded if "MatMul" in n]  # every projection int8

    outlier = _with_outlier(t5_checkpoint("v1.1", std=0.1), 1000.0)
    with torch.no_grad():  # the same function in float32
        same = plain.encoder(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
        moved = outlier.encoder(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
    assert (same - moved).abs().max() < 1e-4
    options = PrecisionOptions(allow_degraded=True)
    _, result, manifest = export_variant(tmp_path / "outlier", outlier, ["int8"], graphs=["encoder"],
                                          precision_options=options)  # fmt: skip
    assert result.gates["int8"].passed
    excluded = [n for n in manifest.entry("encoder", "int8").quantization["excluded_nodes"] if "MatMul" in n]
    assert excluded[0] == "/encoder/layers.1/ff/linear2/MatMul", excluded  # the most damaging node, kept first

    quantized_anyway = load(tmp_path / "outlier" / "out", precision="int8", providers=["CPUExecutionProvider"])
    fp32 = load(tmp_path / "outlier" / "out", providers=["CPUExecutionProvider"])
    a, b = quantized_anyway.encode(ids, mask), fp32.encode(ids, mask)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cos[mask.astype(bool)].min() > 0.98


def test_seq2seq_benchmark_runs_each_variant_in_its_own_process(exported, tmp_path):
    """The generation benchmark's engine on a small folder: transformers and edgeattn side by side,
    the same greedy tokens, and the table and JSON (the full run is benchmarks/t5_generation.py)."""
    from edgeattn.benchmark.report import write_json
    from edgeattn.families.seq2seq.peers import bench_seq2seq

    _, ref, _, _ = exported
    ref.save_pretrained(tmp_path / "hf")
    result = bench_seq2seq(tmp_path / "hf", tmp_path / "work", batches=(2,), src_len=9, new_tokens=5, passes=1,
                           variants=("transformers", "edgeattn-fp32", "edgeattn-fp32-opt"))  # fmt: skip
    assert not result.skipped, result.skipped
    rows = {r.variant: r for r in result.rows}
    assert set(rows) == {"transformers", "edgeattn-fp32", "edgeattn-fp32-opt"} and rows["transformers"].ratio == 1.0
    for ours in ("edgeattn-fp32", "edgeattn-fp32-opt"):
        assert rows[ours].agreement == 1.0 and rows[ours].tokens_per_s > 0
        assert rows[ours].pass_rates == [rows[ours].tokens_per_s]  # one pass of one run
    assert rows["edgeattn-fp32"].resident_mb > 0 and "edgeattn-fp32" in result.table()
    write_json(result, tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text())["rows"][0]["batch"] == 2


@pytest.mark.slow
def test_the_readmes_t5_commands_run_as_written(tmp_path, monkeypatch):
    """Every ``$ edgeattn`` line of docs/t5.md, on a small random folder named as it
    says: an export exits 0, or (a random model's int8) is refused by the gate in one line and then
    kept with --allow-degraded as the page describes; every run prints answers."""
    import shlex
    import shutil

    from click.testing import CliRunner

    from edgeattn.cli import cli

    page = (Path(__file__).resolve().parents[3] / "docs" / "t5.md").read_text(encoding="utf-8")
    commands = [line[2:] for line in page.splitlines() if line.startswith("$ edgeattn ")]
    assert len(commands) >= 5 and any("--stream" in c for c in commands)
    monkeypatch.chdir(tmp_path)
    t5_folder(tmp_path / "my-t5", "v1.1")
    (tmp_path / "articles.txt").write_text("\n".join(T5_CORPUS) + "\n")
    ran: set[tuple[str, ...]] = set()  # exports already made as written: the same command makes the same files
    for command in commands:
        args = shlex.split(command)[1:]
        if tuple(args) in ran:
            continue
        if args[0] == "export":
            shutil.rmtree(tmp_path / "t5", ignore_errors=True)
        result = CliRunner().invoke(cli, args)
        if args[0] == "export" and result.exit_code == 1:
            assert "miss their accuracy thresholds" in result.output, result.output
            args = [*args, "--allow-degraded"]
            result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, (command, result.output)
        if args[0] == "export":
            ran.add(tuple(args))
        if args[0] == "run":
            lines = result.output.strip().splitlines()
            assert lines and len(lines) == (len(T5_CORPUS) if "--file" in args else 1), (command, result.output)
