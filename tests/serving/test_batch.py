"""``edgeattn batch``: every row of an input through an export's served task into Parquet parts,
in-process and on a real local Ray cluster (a head and two worker nodes as processes here): the
same answers as the runtime, row for row; a job stopped midway resumes and writes each row once;
a worker node removed mid-job loses no row and duplicates none."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgeattn.cli import cli
from edgeattn.errors import EdgeattnError
from edgeattn.runtime import load
from tests.helpers.bundles import bert_export

pytest.importorskip("pyarrow")
from edgeattn.serving import batch as batch_module  # noqa: E402
from edgeattn.serving.batch import read_output, run_batch  # noqa: E402

#: passages of the sea, a few hundred (the tiny tokenizer's words)
TEXTS = [f"Angela Merkel visited Warsaw in May {i}." if i % 3 else f"Edge devices run {i}." for i in range(700)]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bert_export(tmp_path_factory.mktemp("batch"), "Model")


@pytest.fixture(scope="module")
def passages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("passages") / "passages.jsonl"
    with open(path, "w") as f:
        for i, text in enumerate(TEXTS):
            f.write(json.dumps({"id": f"p{i}", "text": text}) + "\n")
    return path


def _same(a: list[dict], b: list[dict]) -> None:
    assert [r["id"] for r in a] == [r["id"] for r in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(np.array(x["last_hidden_state"]), np.array(y["last_hidden_state"]), atol=1e-6)
        assert x["attention_mask"] == y["attention_mask"] and x["error"] == y["error"]


def test_a_batch_job_answers_as_the_runtime_and_resumes_after_a_crash(
        export: Path, passages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A job that dies after writing two parts leaves two whole parts; the rerun writes the other
    three and the output equals a job run at once, and the runtime's own answers, row for row."""
    whole = run_batch(export, passages, tmp_path / "whole", chunk_rows=150, progress=False)
    assert (whole.rows, whole.chunks, whole.written, whole.errors) == (700, 5, 5, 0)
    want = read_output(tmp_path / "whole")
    model = load(export)
    for record, text in zip(want[:5], TEXTS[:5], strict=True):
        batch = model.text_batch([text])
        hidden = model.encode(batch.ids, batch.mask)
        np.testing.assert_allclose(np.array(record["last_hidden_state"]), hidden[0][: batch.mask.sum()], atol=1e-6)
    real_write = batch_module.write_part
    written = []

    def dies_after_two(out_dir, chunk, records, schema=None):
        if len(written) == 2:
            raise KeyboardInterrupt  # the job is killed between parts
        real_write(out_dir, chunk, records, schema)
        written.append(chunk.index)

    monkeypatch.setattr(batch_module, "write_part", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_batch(export, passages, tmp_path / "resumed", chunk_rows=150, progress=False)
    monkeypatch.setattr(batch_module, "write_part", real_write)
    assert sorted(p.name for p in (tmp_path / "resumed").glob("part-*")) == ["part-000000.parquet",
                                                                            "part-000001.parquet"]  # fmt: skip
    again = run_batch(export, passages, tmp_path / "resumed", chunk_rows=150, progress=False)
    assert (again.written, again.skipped) == (3, 2)
    _same(read_output(tmp_path / "resumed"), want)
    done = run_batch(export, passages, tmp_path / "resumed", chunk_rows=150, progress=False)
    assert (done.written, done.skipped) == (0, 5)


def test_a_batch_job_refuses_what_would_mix_two_jobs(export: Path, passages: Path, tmp_path: Path) -> None:
    run_batch(export, passages, tmp_path / "out", chunk_rows=300, progress=False)
    with pytest.raises(EdgeattnError, match="another job's output .*chunk_rows"):
        run_batch(export, passages, tmp_path / "out", chunk_rows=100, progress=False)
    changed = tmp_path / "changed.jsonl"
    changed.write_text(passages.read_text().replace('"id": "p3"', '"id": "q3"'))
    job = json.loads((tmp_path / "out" / "_job.json").read_text())
    job["input"] = str(changed.resolve())
    (tmp_path / "out" / "_job.json").write_text(json.dumps(job, indent=2) + "\n")
    with pytest.raises(EdgeattnError, match="the input changed"):
        run_batch(export, changed, tmp_path / "out", chunk_rows=300, progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(EdgeattnError, match="not empty"):
        run_batch(export, passages, tmp_path / "other", progress=False)
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(EdgeattnError, match="given twice"):
        run_batch(export, twice, tmp_path / "twice", progress=False)


def test_the_command_line_batches_text_lines_and_names_each_rows_error(export: Path, tmp_path: Path) -> None:
    """A text file, a row a line; a line too long for the model is that row's error, the others answered."""
    lines = tmp_path / "lines.txt"
    lines.write_text("the sea is calm\n\n" + " ".join(["word"] * 600) + "\nedge devices run\n")
    result = CliRunner().invoke(cli, ["batch", str(export), "--input", str(lines), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "3 rows in 1 parts: 1 written, 0 already there, 1 row(s) with an error" in result.output
    records = read_output(tmp_path / "out")
    assert [r["id"] for r in records] == ["0", "2", "3"]
    assert records[1]["error"] and "tokens" in records[1]["error"] and records[1]["last_hidden_state"] is None
    assert records[0]["error"] is None and records[2]["error"] is None
    missing = CliRunner().invoke(cli, ["batch", str(export), "--input", str(tmp_path / "nowhere.jsonl"), "-o",
                                       str(tmp_path / "x")])  # fmt: skip
    assert missing.exit_code != 0 and "no such file" in missing.output


@pytest.mark.slow
def test_a_ray_job_on_a_local_cluster_survives_a_worker_node_removed_midway(export: Path, passages: Path,
                                                                            tmp_path: Path) -> None:  # fmt: skip
    """A head and two worker nodes (processes here); the job's actors on the workers; one worker node
    removed while chunks are being answered: the job finishes, every row written exactly once, the
    output equal to the in-process job's row for row."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from edgeattn.serving.ray_batch import run_batch_on_ray

    run_batch(export, passages, tmp_path / "local", chunk_rows=20, progress=False)
    want = read_output(tmp_path / "local")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        removed = threading.Event()
        parts_then: list[int] = []

        def remove_a_worker() -> None:
            out = tmp_path / "ray"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and len(list(out.glob("part-*"))) < 2:
                time.sleep(0.02)
            parts_then.append(len(list(out.glob("part-*"))))
            cluster.remove_node(workers[0])  # its actor dies mid-job; Ray restarts it on the other node
            removed.set()

        remover = threading.Thread(target=remove_a_worker, daemon=True)
        remover.start()
        result = run_batch_on_ray(export, passages, tmp_path / "ray", chunk_rows=20, concurrency=2, threads=1,
                                  progress=False)  # fmt: skip
        remover.join(timeout=30)
        assert removed.is_set() and parts_then[0] < result.chunks, "the node was not removed while the job ran"
        assert (result.rows, result.chunks) == (700, 35)
        got = read_output(tmp_path / "ray")
        assert sorted(r["id"] for r in got) == sorted(f"p{i}" for i in range(700))  # each row once
        _same(got, want)
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_batch_job_generates_with_each_rows_settings(tmp_path: Path) -> None:
    """A language model's JSONL rows with their own settings (new tokens, a chat row): the answers
    the runtime gives those prompts, greedy."""
    from tests.helpers.causal_folders import save_folder

    folder, _ = save_folder("llama-gqa-tied", tmp_path / "hf", tokenizer=True)
    export = tmp_path / "lm"
    made = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(export)])
    assert made.exit_code == 0, made.output
    rows = [{"id": "a", "text": "the sea is", "max_new_tokens": 5},
            {"id": "b", "text": "hello how", "max_new_tokens": 3},
            {"id": "c", "text": "write a haiku", "max_new_tokens": 4}]  # fmt: skip
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(cli, ["batch", str(export), "--input", str(tmp_path / "prompts.jsonl"), "-o",
                                      str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 0, result.output
    got = read_output(tmp_path / "out")
    model = load(export)
    for record, row in zip(got, rows, strict=True):
        (answer, tokens), = model.generate_answers([row["text"]], row["max_new_tokens"])
        assert record["id"] == row["id"] and record["answer"] == answer and record["tokens"] == list(tokens)
        assert len(record["tokens"]) <= row["max_new_tokens"]
