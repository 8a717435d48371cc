"""Hugging Face encoders from local folders: the config knobs they need, the key and shape mapping,
and the exported graphs against ``transformers`` eager on padded batches of unseen lengths."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeattn.config import ModelConfig
from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.exporters.export import export_model
from edgeattn.hf import KNOWN_ARCHITECTURES, import_folder
from edgeattn.model import build_model
from edgeattn.runtime import load, read_manifest
from edgeattn.sources import resolve_model
from tests.helpers.encoder_folders import (
    BERT_SPECIALS,
    LABELS,
    SIZES,
    TEXTS,
    make_checkpoint,
    make_tokenizer,
    sentence_folder,
    text_export,
)

transformers = pytest.importorskip("transformers")

ENC = ModelConfig(architecture="encoder", vocab_size=50, d_model=32, n_heads=4, d_ff=48, n_encoder_layers=2,
                  n_decoder_layers=0, max_len=40, dropout=0.0, position="learned", scale_embedding=False)  # fmt: skip


# ------------------------------------------------------------------------------ config knobs
@pytest.mark.quick
def test_token_types_add_one_row_per_segment():
    model = build_model(ENC.replace(token_types=2), seed=0)
    ids = torch.tensor([[5, 6, 7, 8]])
    zeros, ones = torch.zeros_like(ids), torch.ones_like(ids)
    with torch.no_grad():
        assert torch.equal(model.encode(ids), model.encode(ids, token_type_ids=zeros))
        assert not torch.allclose(model.encode(ids, token_type_ids=zeros), model.encode(ids, token_type_ids=ones))
        model.token_type.weight[1] = model.token_type.weight[0]
        assert torch.equal(model.encode(ids, token_type_ids=zeros), model.encode(ids, token_type_ids=ones))
    assert build_model(ENC, seed=0).token_type is None


@pytest.mark.quick
def test_position_offset_counts_real_tokens_only():
    cfg = ENC.replace(position_offset=2, pad_id=1)
    model = build_model(cfg, seed=0)
    assert model.encoder.position.weight.shape[0] == cfg.max_len + 2
    right = torch.tensor([[5, 6, 7, 1, 1]])
    left = torch.tensor([[1, 1, 5, 6, 7]])
    assert model.positions(right).tolist() == [[2, 3, 4, 1, 1]]
    assert model.positions(left).tolist() == [[1, 1, 2, 3, 4]]
    with torch.no_grad():
        alone = model.encode(torch.tensor([[5, 6, 7]]))
        padded_right = model.encode(right, (right != 1).long())[:, :3]
        padded_left = model.encode(left, (left != 1).long())[:, 2:]
    assert torch.allclose(alone, padded_right, atol=1e-6) and torch.allclose(alone, padded_left, atol=1e-6)


@pytest.mark.quick
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_pooler_is_a_dense_layer_and_activation_before_the_classifier(activation):
    model = build_model(ENC.replace(head="sequence", num_labels=3, pooling="first", pooler=activation), seed=0)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with torch.no_grad():
        hidden, logits = model(ids)
        act = torch.tanh if activation == "tanh" else torch.relu
        want = model.classifier(act(model.pooler(hidden[:, 0])))
    assert torch.allclose(logits, want)


def test_encoder_import_knobs_are_written_only_where_used():
    assert not {"token_types", "position_offset", "pooler"} & set(ENC.to_dict())  # old configs read as before
    used = ENC.replace(token_types=2, position_offset=2, pooler="relu", head="sequence")
    assert {"token_types": 2, "position_offset": 2, "pooler": "relu"}.items() <= used.to_dict().items()
    assert ModelConfig.from_dict(used.to_dict()) == used and ModelConfig.from_json(ENC.to_json()) == ENC


def test_encoder_only_knobs_are_refused_elsewhere():
    seq2seq = ModelConfig(d_model=32, n_heads=4, d_ff=48)
    for change in ({"token_types": 2}, {"pooler": "tanh"}):
        with pytest.raises(ConfigError, match="architecture='encoder' only"):
            seq2seq.replace(**change)
    with pytest.raises(ConfigError, match="position_offset needs learned positions"):
        ENC.replace(position="sinusoidal", position_offset=2)


def _batch(family: str) -> dict[str, torch.Tensor]:
    """Three rows of lengths 11, 7 and 3 (the export traced 8), right-padded; segments for BERT."""
    pad = 1 if family == "Roberta" else 0
    rng = np.random.default_rng(3)
    ids = np.full((3, 11), pad)
    mask = np.zeros((3, 11), np.int64)
    for row, n in enumerate((11, 7, 3)):
        ids[row, :n] = rng.integers(3, 99, n)
        mask[row, :n] = 1
    batch = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
    if family == "Bert":
        batch["token_type_ids"] = torch.tensor((np.arange(11) >= 5).astype(np.int64)[None].repeat(3, 0) * mask)
    return batch


@pytest.mark.parametrize("family", ["Bert", "Roberta", "DistilBert"])
@pytest.mark.parametrize("head", ["Model", "ForSequenceClassification", "ForTokenClassification"])
def test_exported_checkpoint_matches_transformers(tmp_path, family, head):
    reference = make_checkpoint(family, head)
    reference.save_pretrained(tmp_path / "hf")
    source = resolve_model(from_hf=tmp_path / "hf")
    result = export_model(source.model, tmp_path / "out", graphs=["encoder"], task=source.task,
                          architecture=source.architecture, labels=source.labels)  # fmt: skip
    assert result.report.passed, result.report.table()
    batch = _batch(family)
    with torch.no_grad():
        want = reference(**batch, output_hidden_states=True)
    runtime = load(tmp_path / "out", providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy() for k, v in batch.items()}
    valid = feeds["attention_mask"].astype(bool)
    hidden = runtime.encode(**feeds)
    want_hidden = (want.last_hidden_state if head == "Model" else want.hidden_states[-1]).numpy()
    assert np.abs(hidden - want_hidden)[valid].max() < 1e-4
    manifest = read_manifest(tmp_path / "out")
    assert manifest.architecture == f"{family}{head}"
    if head == "ForSequenceClassification":
        logits = runtime.classify(**feeds)
        assert np.abs(logits - want.logits.numpy()).max() < 1e-4 and manifest.task == "classify"
        assert manifest.labels == list(LABELS.values())
    elif head == "ForTokenClassification":
        logits = runtime.tag(**feeds)
        assert np.abs(logits - want.logits.numpy())[valid].max() < 1e-4 and manifest.task == "tag"
    else:
        assert manifest.task == "encode" and manifest.labels is None
    if family == "Bert":
        assert "token_type_ids" in runtime.specs["encoder"].input_names
    else:
        assert "token_type_ids" not in runtime.specs["encoder"].input_names


def test_int8_of_an_imported_checkpoint_passes_the_gate(tmp_path):
    make_checkpoint("Bert", "ForTokenClassification").save_pretrained(tmp_path / "hf")
    source = resolve_model(from_hf=tmp_path / "hf")
    result = export_model(source.model, tmp_path / "out", graphs=["encoder"], precisions=["fp32-opt", "int8"])
    assert result.gates["int8"].passed and result.gates["fp32-opt"].passed
    fused = read_manifest(tmp_path / "out").graphs["encoder"].precisions["fp32-opt"]
    assert fused.attention_fused == fused.attention_blocks == 2


@pytest.mark.quick
def test_pickle_checkpoints_load_with_weights_only_and_run_no_code(tmp_path):
    reference = make_checkpoint("DistilBert", "ForSequenceClassification")
    reference.save_pretrained(tmp_path / "hf")
    folder = tmp_path / "hf"
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(tensors, folder / "pytorch_model.bin")
    model = import_folder(folder).model
    assert torch.equal(model.classifier.weight, tensors["classifier.weight"])

    planted = tmp_path / "planted"

    class Payload:
        def __reduce__(self):
            return (Path.write_text, (planted, "ran"))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"x": Payload()}))
    with pytest.raises(CheckpointError, match="weights_only=True"):
        import_folder(folder)
    assert not planted.exists()


def _broken(tmp_path: Path, change) -> Path:
    make_checkpoint("Bert", "ForSequenceClassification").save_pretrained(tmp_path / "hf")
    change(tmp_path / "hf")
    return tmp_path / "hf"


def _edit_tensors(folder: Path, edit) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def _edit_config(folder: Path, edit) -> None:
    data = json.loads((folder / "config.json").read_text())
    edit(data)
    (folder / "config.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda f: (f / "model.safetensors").unlink(), CheckpointError, "holds no model.safetensors"),
        (lambda f: (f / "config.json").unlink(), ConfigError, "has no config.json"),
        (lambda f: _edit_tensors(f, lambda t: t.update({"bert.pooler.dense.weigh": t.pop("bert.pooler.dense.weight")})),
         CheckpointError, "does not use: bert.pooler.dense.weigh"),
        (lambda f: _edit_tensors(f, lambda t: t.pop("classifier.bias")), CheckpointError,
         "missing tensor.*classifier.bias"),
        (lambda f: _edit_tensors(f, lambda t: t.update({"classifier.weight": torch.zeros(5, 31)})), CheckpointError,
         r"tensor classifier.weight has shape \(5, 31\), the model expects \(5, 32\)"),
        (lambda f: _edit_config(f, lambda c: c.update(architectures=["MambaForCausalLM"], model_type="mamba")),
         ConfigError, "MambaForCausalLM .* is not one edgeattn imports: BertModel, BertForSequenceClassification"),
        (lambda f: _edit_config(f, lambda c: c.update(architectures=["BertForMaskedLM"])), ConfigError,
         "BertForMaskedLM"),
    ],
)  # fmt: skip
@pytest.mark.quick
def test_a_broken_folder_is_one_error_naming_the_problem(tmp_path, change, error, message):
    with pytest.raises(error, match=message):
        import_folder(_broken(tmp_path, change))


@pytest.mark.quick
def test_task_override_and_refusal(tmp_path):
    make_checkpoint("Roberta", "ForSequenceClassification").save_pretrained(tmp_path / "hf")
    hf = import_folder(tmp_path / "hf", task="embed")
    assert hf.task == "embed" and hf.model.classifier is None and hf.pooling.mode == "mean"
    with pytest.raises(ConfigError, match="has no tag head"):
        import_folder(tmp_path / "hf", task="tag")
    assert "RobertaForTokenClassification" in KNOWN_ARCHITECTURES


@pytest.mark.quick
def test_sentence_embedding_folders_record_their_pooling(tmp_path):
    folder = tmp_path / "st"
    make_checkpoint("Bert", "Model").save_pretrained(folder)
    sentence_folder(folder, "cls")
    source = resolve_model(from_hf=folder)
    assert source.task == "embed" and source.pooling.mode == "cls" and source.pooling.normalize
    export_model(source.model, tmp_path / "out", graphs=["encoder"], verify=False, task=source.task,
                 pooling=source.pooling)  # fmt: skip
    assert read_manifest(tmp_path / "out").pooling.mode == "cls"


def test_cli_exports_a_folder_and_names_a_bad_one_in_one_line(tmp_path):
    make_checkpoint("DistilBert", "ForTokenClassification").save_pretrained(tmp_path / "hf")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "edgeattn.cli", *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300)  # fmt: skip

    ok = cli("export", "--from-hf", "hf", "-o", "out", "--graphs", "encoder")
    assert ok.returncode == 0, ok.stderr
    assert read_manifest(tmp_path / "out").labels == list(LABELS.values())
    _edit_config(tmp_path / "hf", lambda c: c.update(architectures=["DistilBertForMaskedLM"]))
    bad = cli("export", "--from-hf", "hf", "-o", "out2")
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "DistilBertForMaskedLM" in bad.stderr
    mixed = cli("export", "--from-hf", "hf", "--preset", "tiny")
    assert mixed.returncode == 2


@pytest.mark.parametrize(("family", "aggregation"), [("Bert", "simple"), ("DistilBert", "simple"), ("Bert", "first")])
def test_tag_spans_equal_the_token_classification_pipeline(tmp_path, family, aggregation):
    reference, tokenizer, runtime = text_export(tmp_path, family, "ForTokenClassification")
    pipe = transformers.pipeline("token-classification", model=reference, tokenizer=tokenizer,
                                 aggregation_strategy=aggregation)  # fmt: skip
    ours, theirs = runtime.tag(TEXTS, aggregation=aggregation), pipe(TEXTS)
    assert sum(len(e) for e in ours) > 3
    if aggregation == "first":  # words of several pieces: not what token-level grouping gives
        assert ours != runtime.tag(TEXTS)
    for text, got, want in zip(TEXTS, ours, theirs, strict=True):
        assert [(e.entity_group, e.start, e.end) for e in got] == [
            (w["entity_group"], w["start"], w["end"]) for w in want
        ]
        assert all(abs(e.score - float(w["score"])) < 1e-4 for e, w in zip(got, want, strict=True))
        assert all(e.word == text[e.start : e.end] for e in got)


def test_classify_labels_equal_the_text_classification_pipeline(tmp_path):
    reference, tokenizer, runtime = text_export(tmp_path, "Roberta", "ForSequenceClassification")
    pipe = transformers.pipeline("text-classification", model=reference, tokenizer=tokenizer, top_k=None)
    for got, want in zip(runtime.classify(TEXTS), pipe(TEXTS), strict=True):
        best = max(want, key=lambda w: w["score"])
        assert got.label == best["label"] and abs(got.score - best["score"]) < 1e-5
        assert abs(sum(got.scores.values()) - 1.0) < 1e-6 and set(got.scores) == set(LABELS.values())


def test_embed_pools_and_normalises_as_the_folder_says(tmp_path):
    reference, tokenizer, runtime = text_export(tmp_path, "Bert", "Model", sentence_folder)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"][:, :, None].float()
    want = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    got = runtime.embed(TEXTS)
    assert got.shape == (3, 32) and np.abs(got - want).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_long_texts_are_refused_unless_truncation_is_asked_for(tmp_path):
    from edgeattn.runtime import InputError

    _, tokenizer, runtime = text_export(tmp_path, "Bert", "ForSequenceClassification")
    long = " ".join(["weather"] * 200)
    with pytest.raises(InputError, match=r"text 0 is \d+ tokens long; this model takes at most 64"):
        runtime.classify([long])
    batch = runtime.text_batch([long, "Edge devices run."], truncate=True)
    want = tokenizer([long], truncation=True, max_length=64)["input_ids"][0]
    assert batch.ids.shape == (2, 64) and batch.ids[0].tolist() == want
    assert runtime.classify([long], truncate=True)[0].label in LABELS.values()


def test_text_runtime_needs_neither_torch_nor_transformers(tmp_path):
    text_export(tmp_path, "Bert", "ForTokenClassification")
    code = (
        "import sys\nsys.modules['torch'] = None\nsys.modules['transformers'] = None\n"
        "from edgeattn.runtime import load\n"
        f"m = load({str(tmp_path / 'out')!r})\n"
        "print(len(m.tag(['Angela Merkel visited Paris.'])[0]) >= 0, m.embed(['a b']).shape)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True (1, 32)"


@pytest.mark.filterwarnings("ignore:Specified provider 'OpenVINOExecutionProvider'")  # the stock onnxruntime's
def test_run_says_when_it_chose_openvino(tmp_path, monkeypatch, built_in_providers):
    """Where OpenVINO runs (taken as running here: the session falls back to the CPU provider in a
    stock onnxruntime), `edgeattn run` says on stderr which graph it put there and why, and how to
    keep ONNX Runtime's CPU provider; the answer on stdout is unchanged."""
    from click.testing import CliRunner

    from edgeattn.cli import cli
    from edgeattn.runtime import engines
    from edgeattn.runtime.providers import OPENVINO

    text_export(tmp_path, "Bert", "ForSequenceClassification")
    plain = CliRunner().invoke(cli, ["run", str(tmp_path / "out"), "Edge devices run.", "--cpu"])
    built_in_providers(OPENVINO, "CPUExecutionProvider")
    monkeypatch.setattr(engines, "openvino_usable", lambda device="CPU": True)
    chosen = CliRunner().invoke(cli, ["run", str(tmp_path / "out"), "Edge devices run."])
    assert plain.exit_code == chosen.exit_code == 0, chosen.output
    assert chosen.stdout == plain.stdout and "OpenVINO" not in plain.stderr
    said = chosen.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"encoder graph on {OPENVINO} (precision_hint=f32): OpenVINO runs")
    assert "--cpu" in said[0]


# ------------------------------------------------------------------ held-out text, benchmark
def test_the_gate_runs_on_the_users_heldout_text(tmp_path):
    """--heldout: the gate measures int8 on the model's own text, and the manifest says so."""
    from click.testing import CliRunner

    from edgeattn.cli import cli

    make_tokenizer(*BERT_SPECIALS).save_pretrained(tmp_path / "hf")
    make_checkpoint("Bert", "ForTokenClassification").save_pretrained(tmp_path / "hf")
    (tmp_path / "heldout.txt").write_text("# sentences the model never saw\n" + "\n".join(TEXTS) + "\n")
    args = ["export", "--from-hf", str(tmp_path / "hf"), "--graphs", "encoder", "--precision", "int8"]
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "a"), "--heldout", str(tmp_path / "heldout.txt")])
    assert result.exit_code == 0, result.output
    assert "held out: file heldout.txt (3 sequences)" in result.output
    gate = read_manifest(tmp_path / "a").gates["int8"]
    assert gate.heldout == "file heldout.txt (3 sequences)" and gate.passed
    drawn = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "b")])
    assert drawn.exit_code == 0, drawn.output
    drawn_gate = read_manifest(tmp_path / "b").gates["int8"]
    assert drawn_gate.heldout == "drawn from the model's vocabulary (48 sequences)"
    assert drawn_gate.metrics != gate.metrics  # other inputs, other figures
    (tmp_path / "long.txt").write_text("Paris\n" + " ".join(["Paris"] * 70) + "\n")
    long = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "c"), "--heldout", str(tmp_path / "long.txt")])
    assert long.exit_code == 1 and "long.txt line 2: 72 tokens, more than the model's max_len 64" in long.output
    alone = CliRunner().invoke(cli, [*args[:-2], "-o", str(tmp_path / "d"), "--heldout", str(tmp_path / "heldout.txt")])
    assert alone.exit_code == 2 and "--heldout is for gated precisions" in alone.output
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


@pytest.mark.slow
def test_bench_times_optimum_and_transformers_on_the_same_checkpoint(tmp_path):
    """An imported export's benchmark: transformers eager and Optimum's exports of the very folder
    timed beside it, and every variant's logits measured against transformers eager."""
    from edgeattn.benchmark.run import BenchOptions, run_benchmark
    from edgeattn.errors import EdgeattnError

    make_checkpoint("Roberta", "ForTokenClassification").save_pretrained(tmp_path / "hf")
    source = resolve_model(from_hf=tmp_path / "hf")
    export_model(source.model, tmp_path / "out", graphs=["encoder"], precisions=["fp32-opt", "int8"],
                 task=source.task, architecture=source.architecture, source_folder=tmp_path / "hf")  # fmt: skip
    assert read_manifest(tmp_path / "out").source_folder == str((tmp_path / "hf").resolve())
    options = BenchOptions(shapes=((1, 16), (2, 24)), precisions=("fp32", "fp32-opt", "int8"), repeats=2,
                           memory=False)  # fmt: skip
    report, _ = run_benchmark(tmp_path / "out", options=options, json_path=tmp_path / "b.json")
    names = set(report.variants)
    assert {"eager fp32", "onnx fp32 CPU", "onnx int8 CPU", "peer transformers eager fp32"} <= names
    try:
        import optimum.onnxruntime  # noqa: F401

        optimum = {"peer Optimum fp32", "peer Optimum fp32 O2", "peer Optimum int8"}
    except ImportError:
        optimum = set()
        assert "optimum-onnx is not installed" in report.skipped["peer Optimum"]
    assert optimum <= names and "peer HF BERT ORT fused fp32" not in names
    assert {r.variant for r in report.rows} == names
    exact = ["eager fp32", "onnx fp32 CPU", "onnx fp32-opt CPU", *sorted(optimum - {"peer Optimum int8"})]
    for name in exact:
        a = report.agreement[name]
        assert a["max_abs"] < 1e-4 and a["cosine_min"] > 0.99999 and a["top1"] == 1.0, (name, a)
    for name in {"onnx int8 CPU"} | (optimum & {"peer Optimum int8"}):
        a = report.agreement[name]
        assert 0 < a["max_abs"] and a["cosine_min"] > 0.9 and a["top1"] > 0.8, (name, a)
    assert "logits against transformers eager float32" in report.table()
    assert json.loads((tmp_path / "b.json").read_text())["agreement"]["onnx fp32 CPU"]["top1"] == 1.0
    # the folder gone: the export is still timed, the table says how to name the folder, and the
    # accuracy figures fall back to eager PyTorch float32 (edgeattn's model with the imported weights)
    (tmp_path / "hf").rename(tmp_path / "moved")
    options.precisions = ("fp32",)
    report, _ = run_benchmark(tmp_path / "out", options=options)
    assert "give it with --hf-folder" in report.skipped["peers"]
    assert "against eager PyTorch float32" in report.agreement_note
    assert report.agreement["onnx fp32 CPU"]["max_abs"] < 1e-4
    options.hf_folder = tmp_path / "moved"
    report, _ = run_benchmark(tmp_path / "out", options=options)
    assert "peer transformers eager fp32" in report.agreement
    with pytest.raises(EdgeattnError, match="--hf-folder is for exports of a Hugging Face folder"):
        export_model(build_model(ENC), tmp_path / "plain", graphs=["encoder"])
        run_benchmark(tmp_path / "plain", options=options)


def _readme_commands() -> list[str]:
    """The command lines of the manual's worked Hugging Face examples (``$ edgeattn ...``)."""
    page = (Path(__file__).resolve().parents[3] / "docs" / "huggingface.md").read_text(encoding="utf-8")
    return [line[2:] for line in page.splitlines() if line.startswith("$ edgeattn ")]


def readme_folders(folder: Path) -> None:
    """The manual's (docs/huggingface.md) example folders and text files in ``folder``: small random checkpoints with a
    trained tokenizer, perturbed as ``make_checkpoint`` does and their heads sharpened as in
    ``text_export``."""
    tokenizer = make_tokenizer(*BERT_SPECIALS)
    sentiment = {"id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
    torch.manual_seed(0)
    models = {
        "my-ner-model": make_checkpoint("Bert", "ForTokenClassification"),
        "my-sentiment-model": transformers.BertForSequenceClassification(
            transformers.BertConfig(hidden_size=32, intermediate_size=37, **SIZES, **sentiment)),
        "my-sentence-embedder": make_checkpoint("Bert", "Model"),
    }  # fmt: skip
    for name, model in models.items():
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02) if name == "my-sentiment-model" else None
                p.mul_(8.0) if p.dim() == 2 and p.shape[0] in (2, len(LABELS)) else None  # the classifier
        model.eval().save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    sentence_folder(folder / "my-sentence-embedder")
    for name in ("docs.txt", "reviews.txt", "sentences.txt", "heldout.txt"):
        (folder / name).write_text("\n".join(TEXTS) + "\n")


@pytest.mark.slow
def test_the_readmes_worked_examples_run_as_written(tmp_path, monkeypatch):
    """Every command of the manual's classification, entity and embedding examples, on small
    random folders of the names it uses, exits 0 and prints what the manual shows."""
    import shlex

    from click.testing import CliRunner

    from edgeattn.cli import cli

    commands = _readme_commands()
    assert len(commands) >= 6 and any("--heldout" in c for c in commands)
    readme_folders(tmp_path)
    monkeypatch.chdir(tmp_path)
    outputs = {}
    for command in commands:
        result = CliRunner().invoke(cli, shlex.split(command)[1:])
        assert result.exit_code == 0, (command, result.output)
        outputs[command] = result.output
    shown = "\n".join(outputs.values())
    assert "held out: file heldout.txt (3 sequences)" in shown
    assert any(line.split("\t")[0] in ("negative", "positive") for line in shown.splitlines())
    assert '"embedding": [' in shown and '"entities": [' in shown
