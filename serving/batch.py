"""Batch jobs: every row of an input (JSON lines, Parquet, text lines, a folder of images or audio)
through an export's served task (the answers Triton and ``edgeattn serve`` give), written to a
Parquet dataset (a folder of parts) with each row's id.

The rows are cut into chunks in input order; chunk ``k`` is written whole, as ``part-k.parquet``,
by one atomic rename, so a job stopped at any moment leaves complete parts only. A rerun checks the
parts already there against the input (the same ids) and answers only the missing chunks: no row is
lost or written twice. A row the model cannot answer gets its error in the ``error`` column and the
others their answers. In-process here; :mod:`edgeattn.serving.ray_batch` runs the same chunks on a
Ray cluster.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError

log = logging.getLogger(__name__)

#: what a folder's files are read as, by suffix, for the task's one bytes input
MEDIA_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".wav", ".flac", ".mp3", ".ogg", ".m4a"}
#: rows a part holds unless the job says otherwise
CHUNK_ROWS = 256
#: the file beside the parts saying what made them (the export, the task, the chunking, the input)
JOB_FILE = "_job.json"


@dataclass
class Row:
    """One input row: its id and the task's inputs it gives (the one bytes input and any settings)."""

    id: str
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Chunk:
    """Chunk ``index`` of a job: its rows, written as one part."""

    index: int
    rows: tuple[Row, ...]

    @property
    def part(self) -> str:
        return part_name(self.index)


def part_name(index: int) -> str:
    return f"part-{index:06d}.parquet"


def _need_pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise EdgeattnError("edgeattn batch writes Parquet with pyarrow, which is not installed: "
                            "pip install 'edgeattn[batch]'") from exc  # fmt: skip
    return pa, pq


def main_input(task: str) -> str:
    """The name of the task's one required input (``text``, ``image`` or ``audio``)."""
    from edgeattn.serving.tasks import task_inputs

    required = [t.name for t in task_inputs(task) if not t.optional]
    if len(required) != 1:
        raise EdgeattnError(f"task {task} takes {', '.join(required)}: batch jobs take tasks of one input")
    return required[0]


def read_rows(path: Path, task: str) -> list[Row]:
    """The rows of ``path`` for ``task``: a ``.jsonl`` file (each line an object with an optional
    ``id``, the task's input and any of its settings, or a string), a ``.parquet`` file (columns as
    such), a text file (a row a non-empty line), or a folder (a row a media file, its path below the
    folder its id, its bytes the input). Ids are unique (a row without one: its line number)."""
    from edgeattn.serving.tasks import task_inputs

    name = main_input(task)
    known = {t.name for t in task_inputs(task)}
    if not path.exists():
        raise EdgeattnError(f"{path}: no such file or folder")
    rows: list[Row] = []
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in MEDIA_SUFFIXES)
        if not files:
            raise EdgeattnError(f"{path} holds no image or audio files ({', '.join(sorted(MEDIA_SUFFIXES))})")
        rows = [Row(str(p.relative_to(path)), {name: p.resolve()}) for p in files]  # read when its chunk is
    elif path.suffix == ".parquet":
        _, pq = _need_pyarrow()
        for k, record in enumerate(pq.read_table(path).to_pylist()):
            rows.append(_row(record, k, name, known, path))
    elif path.suffix in (".jsonl", ".ndjson"):
        with open(path, encoding="utf-8") as f:
            for k, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise EdgeattnError(f"{path} line {k + 1} is not JSON: {exc.msg}") from exc
                rows.append(_row(record if isinstance(record, dict) else {name: record}, k, name, known, path))
    else:
        with open(path, encoding="utf-8") as f:
            rows = [Row(str(k), {name: line.rstrip("\n")}) for k, line in enumerate(f) if line.strip()]
    seen: set[str] = set()
    for row in rows:
        if row.id in seen:
            raise EdgeattnError(f"{path}: the id {row.id!r} is given twice; every row's id must be its own")
        seen.add(row.id)
    if not rows:
        raise EdgeattnError(f"{path} holds no rows")
    return rows


def _row(record: dict[str, Any], k: int, name: str, known: set[str], path: Path) -> Row:
    if name not in record:
        raise EdgeattnError(f"{path} row {k + 1} has no {name!r}")
    values = {key: value for key, value in record.items() if key in known}
    return Row(str(record.get("id", k)), values)


def chunks(rows: list[Row], chunk_rows: int = CHUNK_ROWS) -> list[Chunk]:
    """The job's chunks: ``chunk_rows`` rows each, in input order."""
    if chunk_rows < 1:
        raise EdgeattnError("chunk rows must be at least 1")
    return [Chunk(k // chunk_rows, tuple(rows[k:k + chunk_rows])) for k in range(0, len(rows), chunk_rows)]


def requests_of(rows: tuple[Row, ...], task: str) -> list[dict[str, np.ndarray]]:
    """Each row as a served request (one row of each input it gives, typed as the task takes it)."""
    from edgeattn.serving.tasks import task_inputs

    tensors = {t.name: t for t in task_inputs(task)}
    out = []
    for row in rows:
        request = {}
        for key, value in row.values.items():
            tensor = tensors[key]
            if isinstance(value, Path):  # a folder's file, read as its chunk is answered
                value = value.read_bytes()
            if tensor.dtype == "bytes":
                data = value if isinstance(value, bytes | str) else json.dumps(value)
                request[key] = np.array([[data.encode("utf-8") if isinstance(data, str) else data]], dtype=np.object_)
            else:
                request[key] = np.array([[value]], dtype=tensor.dtype)
        out.append(request)
    return out


def _cell(value: np.ndarray, scalar: bool) -> Any:
    """One row's output as a Parquet cell: text, a number, or a list of numbers (``scalar``: one value)."""
    if value.dtype == np.object_:
        item = value.reshape(-1)[0]
        return item.decode("utf-8") if isinstance(item, bytes) else str(item)
    return value.reshape(-1)[0].item() if scalar else value.tolist()


def answer_chunk(model: Any, task: str, chunk: Chunk, batch_rows: int = 16) -> list[dict[str, Any]]:
    """The records of a chunk: each row's id, its outputs (or its error)."""
    from edgeattn.serving.tasks import answer, task_outputs

    scalar = {t.name: t.dims == (1,) for t in task_outputs(task, model.config)}
    records: list[dict[str, Any]] = []
    for start in range(0, len(chunk.rows), batch_rows):
        rows = chunk.rows[start:start + batch_rows]
        for row, result in zip(rows, answer(model, task, requests_of(rows, task)), strict=True):
            if isinstance(result, Exception):
                records.append({"id": row.id, "error": str(result)})
            else:
                records.append({"id": row.id, **{k: _cell(v[0], scalar.get(k, False)) for k, v in result.items()},
                                "error": None})  # fmt: skip
    return records


def write_part(out_dir: Path, chunk: Chunk, records: list[dict[str, Any]], schema: Any = None) -> None:
    """Write a chunk's records as its part, whole or not at all (a temporary file renamed)."""
    pa, pq = _need_pyarrow()
    table = pa.Table.from_pylist(records, schema=schema)
    tmp = out_dir / f".{chunk.part}.{os.getpid()}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, out_dir / chunk.part)


def schema_of(model: Any, task: str) -> Any:
    """The parts' schema: ``id``, the task's outputs, ``error``."""
    from edgeattn.serving.tasks import task_outputs

    pa, _ = _need_pyarrow()
    types = {"float32": pa.float32(), "float16": pa.float32(), "int64": pa.int64(), "int32": pa.int32(),
             "bool": pa.bool_(), "bytes": pa.string()}  # fmt: skip
    fields = [pa.field("id", pa.string())]
    for tensor in task_outputs(task, model.config):
        kind = types[tensor.dtype]
        if tensor.dims != (1,):  # a list a row, nested once for each further axis
            for _ in tensor.dims:
                kind = pa.list_(kind)
        fields.append(pa.field(tensor.name, kind))
    fields.append(pa.field("error", pa.string()))
    return pa.schema(fields)


def job_description(export_dir: Path, task: str, input_path: Path, chunk_rows: int, rows: int) -> dict[str, Any]:
    return {"export": str(Path(export_dir).resolve()), "task": task, "input": str(Path(input_path).resolve()),
            "chunk_rows": chunk_rows, "rows": rows}  # fmt: skip


def prepare_output(out_dir: Path, job: dict[str, Any], all_chunks: list[Chunk]) -> list[Chunk]:
    """Make ``out_dir`` (or check the job already there is this one) and give the chunks it lacks;
    a part whose ids are not its chunk's means the input changed since: an error, nothing written."""
    _, pq = _need_pyarrow()
    out_dir.mkdir(parents=True, exist_ok=True)
    described = out_dir / JOB_FILE
    if described.is_file():
        before = json.loads(described.read_text())
        if before != job:
            differ = ", ".join(k for k in job if before.get(k) != job[k])
            raise EdgeattnError(f"{out_dir} holds another job's output (its {differ} differ): write to another "
                                "folder, or remove it to start again")  # fmt: skip
    else:
        existing = [p for p in out_dir.iterdir() if not p.name.startswith(".")]
        if existing:
            raise EdgeattnError(f"{out_dir} is not empty and holds no {JOB_FILE}: write to another folder")
        described.write_text(json.dumps(job, indent=2) + "\n")
    for stale in out_dir.glob(".part-*.tmp"):  # a part a stopped job was writing
        stale.unlink()
    missing = []
    for chunk in all_chunks:
        path = out_dir / chunk.part
        if not path.is_file():
            missing.append(chunk)
            continue
        ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
        if ids != [r.id for r in chunk.rows]:
            raise EdgeattnError(f"{path} holds other rows than the input's chunk {chunk.index}: the input changed "
                                "since it was written; write to another folder")  # fmt: skip
    return missing


@dataclass
class BatchResult:
    """What a batch job did."""

    out_dir: Path
    rows: int
    chunks: int
    written: int
    skipped: int
    errors: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass
class Job:
    """A batch job made ready: the export loaded (its sessions made when first used), the task, the
    input's rows and chunks, and the chunks its output folder lacks."""

    model: Any
    task: str
    rows: list[Row]
    chunks: list[Chunk]
    missing: list[Chunk]
    out_dir: Path
    description: dict[str, Any]

    def result(self, errors: int, seconds: float) -> BatchResult:
        return BatchResult(self.out_dir, len(self.rows), len(self.chunks), len(self.missing),
                           len(self.chunks) - len(self.missing), errors, seconds)  # fmt: skip


def plan_job(export_dir: Path, input_path: Path, out_dir: Path, task: str | None = None, chunk_rows: int = CHUNK_ROWS,
             precision: str | None = None, threads: int | None = None) -> Job:  # fmt: skip
    """Load the export, read and chunk the input and check the output folder (:func:`prepare_output`)."""
    from edgeattn.runtime import load
    from edgeattn.serving.tasks import task_of

    model = load(export_dir, precision=precision or "fp32", threads=threads)
    chosen = task_of(model.config, task, model.manifest.task if model.manifest else None)
    rows = read_rows(Path(input_path), chosen)
    all_chunks = chunks(rows, chunk_rows)
    description = job_description(export_dir, chosen, input_path, chunk_rows, len(rows))
    missing = prepare_output(Path(out_dir), description, all_chunks)
    return Job(model, chosen, rows, all_chunks, missing, Path(out_dir), description)


def write_chunk(model: Any, task: str, chunk: Chunk, out_dir: Path, schema: Any, batch_rows: int = 16) -> int:
    """Answer a chunk and write its part; how many of its rows have an error."""
    records = answer_chunk(model, task, chunk, batch_rows)
    write_part(out_dir, chunk, records, schema)
    return sum(r["error"] is not None for r in records)


def row_bar(total: int, show: bool, desc: str = "batch") -> Any:
    """A progress bar of rows (and rows a second), shown where ``show``."""
    from tqdm import tqdm

    return tqdm(total=total, unit="row", desc=desc, dynamic_ncols=True, disable=not show)


def run_batch(export_dir: Path, input_path: Path, out_dir: Path, task: str | None = None,
              chunk_rows: int = CHUNK_ROWS, batch_rows: int = 16, precision: str | None = None,
              progress: bool = True) -> BatchResult:  # fmt: skip
    """Answer every row of ``input_path`` with the export at ``export_dir`` in this process, writing the
    parts ``out_dir`` lacks (see the module)."""
    import time

    start = time.perf_counter()
    job = plan_job(export_dir, input_path, out_dir, task, chunk_rows, precision)
    schema = schema_of(job.model, job.task)
    errors = 0
    with row_bar(sum(len(c.rows) for c in job.missing), progress) as bar:
        for chunk in job.missing:
            errors += write_chunk(job.model, job.task, chunk, job.out_dir, schema, batch_rows)
            bar.update(len(chunk.rows))
    return job.result(errors, time.perf_counter() - start)


def read_output(out_dir: Path) -> list[dict[str, Any]]:
    """Every record of a batch job's output, in input order."""
    _, pq = _need_pyarrow()
    records: list[dict[str, Any]] = []
    for part in sorted(Path(out_dir).glob("part-*.parquet")):
        records.extend(pq.read_table(part).to_pylist())
    return records
