"""The harness that sets an export beside llama.cpp's native llama-bench: edgeattn's timed loop is
the model's own greedy decoding, llama-bench is asked one test at a time and read as it reports,
ratios are edgeattn's over the peer's, and a peer's peak memory is its own process's."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import causal_folders

pytest.importorskip("transformers")
from edgeattn.exporters.export import export_model  # noqa: E402
from edgeattn.families.causal import native_bench  # noqa: E402
from edgeattn.hf import import_folder  # noqa: E402
from edgeattn.runtime import load  # noqa: E402

#: what the stand-in llama-bench allocates and touches, so its peak is known to be above it
FAKE_MB = 160

FAKE = f"""#!{sys.executable}
import json, sys, time
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
with open(__file__ + ".calls", "a") as f:
    f.write(json.dumps(args) + "\\n")
if "missing" in value("-m"):
    sys.stderr.write("error: failed to load model\\n")
    sys.exit(1)
block = bytearray({FAKE_MB} * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(0.3)
p, n, d = int(value("-p")), int(value("-n")), int(value("-d"))
rate = 1000.0 / p if p else 100.0 / (n + d)
print("noise before the JSON")
print(json.dumps([{{"build_commit": "abc1234", "build_number": 7, "n_threads": int(value("-t")), "n_prompt": p,
                   "n_gen": n, "n_depth": d, "avg_ts": rate, "samples_ts": [rate * 0.9, rate, rate * 1.1]}}]))
"""


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("native-bench")
    folder, _ = causal_folders.save_folder("llama-gqa-tied", root / "hf")
    hf = import_folder(folder)
    export_model(hf.model, root / "out", verify=False)
    return root / "out"


@pytest.fixture
def fake_llama_bench(tmp_path):
    path = tmp_path / "build" / "bin" / "llama-bench"
    path.parent.mkdir(parents=True)
    path.write_text(FAKE)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "build" / "CMakeCache.txt").write_text("GGML_NATIVE:BOOL=OFF\nGGML_AMX_INT8:BOOL=OFF\nOTHER:BOOL=ON\n")
    gguf = tmp_path / "model-q4_0.gguf"
    gguf.write_bytes(b"GGUF" + bytes(2000))
    return path, gguf


def test_the_timed_loop_decodes_as_the_model_does(export):
    prompt, steps, reps = 9, 6, 2
    got = native_bench.edgeattn_cell(str(export), "fp32", prompt, steps, 1, reps)
    assert len(got["prefill_tok_s"]) == len(got["decode_tok_s"]) == reps
    assert all(r > 0 for r in got["prefill_tok_s"] + got["decode_tok_s"])
    assert got["peak_mb"] > 10
    rng = np.random.default_rng(prompt)
    model = load(export)
    for _ in range(reps + 1):  # the worker's prompts, of which it reports the last one's tokens
        ids = rng.integers(3, model.config.vocab_size, size=(1, prompt), dtype=np.int64)
    want = model.generate(ids, None, steps + 1).tokens[0]
    real = int(np.argmax(want == model.config.pad_id)) if (want == model.config.pad_id).any() else len(want)
    assert real >= 1
    assert got["tokens"][:real] == want[:real].tolist()


def test_the_run_sets_edgeattn_beside_llama_bench(export, fake_llama_bench):
    binary, gguf = fake_llama_bench
    native_bench.main([str(export), "--precision", "fp32", "--llama-bench", str(binary), "--gguf", f"q4_0={gguf}",
                       "--prompts", "8,16", "--new-tokens", "4", "--threads", "1", "--rounds", "2",
                       "--repetitions", "1", "--out", str(binary.parent / "out.json")])  # fmt: skip
    result = json.loads((binary.parent / "out.json").read_text())
    calls = [json.loads(line) for line in Path(f"{binary}.calls").read_text().splitlines()]
    asked = {(c[c.index("-p") + 1], c[c.index("-n") + 1], c[c.index("-d") + 1]) for c in calls}
    assert asked == {("8", "0", "0"), ("0", "4", "8"), ("16", "0", "0"), ("0", "4", "16")}  # one test a process
    assert len(calls) == 2 * 2 * 2  # rounds x prompts x (prefill, generation)
    rows = {(r["engine"], r["prompt"]): r for r in result["rows"]}
    assert set(rows) == {(e, p) for e in ("edgeattn fp32", "llama.cpp q4_0") for p in (8, 16)}
    for prompt in (8, 16):
        peer, ours = rows[("llama.cpp q4_0", prompt)], rows[("edgeattn fp32", prompt)]
        assert peer["prefill_tok_s"] == pytest.approx(1000 / prompt)  # the median of its samples
        assert peer["decode_tok_s"] == pytest.approx(100 / (4 + prompt))
        assert peer["peak_mb"] >= FAKE_MB  # its own process's, read while it ran
        assert ours["vs"]["llama.cpp q4_0"]["decode"] == pytest.approx(ours["decode_tok_s"] / peer["decode_tok_s"])
        assert ours["vs"]["llama.cpp q4_0"]["prefill"] == pytest.approx(ours["prefill_tok_s"] / peer["prefill_tok_s"])
    assert result["llama_cpp"]["build_commit"] == "abc1234"
    assert result["llama_cpp"]["cmake"] == {"GGML_NATIVE": "OFF", "GGML_AMX_INT8": "OFF"}
    assert result["machine"]["cores"] >= 1
    from edgeattn.benchmark.results_page import native_speed_table

    page = native_speed_table(result)  # the results page's table: the peer's row carries edgeattn's multiple of it
    vs = rows[("edgeattn fp32", 16)]["vs"]["llama.cpp q4_0"]
    assert "| llama.cpp q4_0 | 16 |" in page and f"{vs['prefill']:.2f}x, {vs['decode']:.2f}x |" in page


def test_a_peer_that_fails_is_one_line_naming_it(export, fake_llama_bench, tmp_path):
    binary, _ = fake_llama_bench
    missing = tmp_path / "missing.gguf"
    missing.write_bytes(b"GGUF")
    with pytest.raises(SystemExit, match="exited 1: error: failed to load model"):
        native_bench.main([str(export), "--precision", "fp32", "--llama-bench", str(binary), "--gguf",
                           f"q4_0={missing}", "--prompts", "8", "--rounds", "1"])  # fmt: skip
    with pytest.raises(SystemExit, match="no GGUF at"):
        native_bench.main([str(export), "--precision", "fp32", "--llama-bench", str(binary), "--gguf",
                           f"q4_0={tmp_path / 'nowhere.gguf'}"])  # fmt: skip
