"""An imported Hugging Face checkpoint against Hugging Face Optimum on the same folder.

Exports the folder with ``--from-hf`` (fp32, fp32-opt, int8 through the gate), then times, in one
process: eager PyTorch, every exported precision, ``transformers`` eager, and Optimum's fp32, O2
and dynamic-int8 exports of the same folder; and measures each one's task output against
``transformers`` eager. Without ``--folder`` it builds a BERT-base-shaped
``BertForSequenceClassification`` with random weights (no download)::

    python benchmarks/hf_checkpoint.py --json benchmarks/results/hf-bert-base.json
    python benchmarks/hf_checkpoint.py --folder ./my-finetuned-bert --shapes 1x128,8x128
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from edgeattn.benchmark.run import BenchOptions, run_benchmark
from edgeattn.exporters.export import export_model
from edgeattn.exporters.precision_builds import PrecisionOptions
from edgeattn.sources import resolve_model

log = logging.getLogger("hf_checkpoint")


def bert_base_folder(folder: Path, labels: int = 3, seed: int = 0) -> Path:
    """A randomly initialised BERT-base-shaped sequence classifier saved with ``save_pretrained``."""
    import torch
    import transformers

    config = transformers.BertConfig(num_labels=labels, id2label={i: f"label_{i}" for i in range(labels)},
                                     label2id={f"label_{i}": i for i in range(labels)})  # fmt: skip
    torch.manual_seed(seed)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=None, help="A local Hugging Face folder (default: BERT-base).")
    parser.add_argument("--task", default=None, help="encode, embed, classify or tag (default: the folder's).")
    parser.add_argument("--shapes", default="1x128,8x128,1x512", help="Comma-separated BATCHxSEQ shapes.")
    parser.add_argument("--precisions", default="fp32-opt,int8", help="Exported precisions besides fp32.")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="Write the results as JSON.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    shapes = tuple((int(b), int(s)) for b, _, s in (x.lower().partition("x") for x in args.shapes.split(",")))
    precisions = [p for p in args.precisions.split(",") if p]
    with tempfile.TemporaryDirectory(prefix="edgeattn-hf-") as scratch:
        folder = args.folder or bert_base_folder(Path(scratch) / "bert-base")
        source = resolve_model(from_hf=folder, task=args.task)
        export_dir = Path(scratch) / "export"
        degraded = PrecisionOptions(allow_degraded=True)
        result = export_model(source.model, export_dir, precisions=precisions, precision_options=degraded,
                              progress=True, **source.export_fields())  # fmt: skip
        log.info("exported in %.1f s", result.seconds)
        options = BenchOptions(shapes=shapes, precisions=("fp32", *precisions), repeats=args.repeats,
                               threads=args.threads)  # fmt: skip
        report, _ = run_benchmark(export_dir, options=options, json_path=args.json, progress=True)
    print(report.table())
    if args.json:
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
