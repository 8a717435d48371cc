"""The ``edgeattn`` command line.

The top floor: it imports the rest, nothing imports it. torch is imported only inside the
commands that need it, so ``edgeattn --help`` stays fast and torch-free.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgeattn import __version__
from edgeattn.errors import EdgeattnError
from edgeattn.extras import require_extra
from edgeattn.phases import log as _phases_log
from edgeattn.phases import phase
from edgeattn.runtime.families import all_tasks, offered_graphs
from edgeattn.runtime.precisions import (
    CALIBRATION_METHODS,
    FP32,
    PRECISIONS,
    float32_precisions,
    get_precision,
    graph_precisions,
    reduced_precisions,
)

log = logging.getLogger("edgeattn")

DEFAULT_OUTPUT = "edgeattn-export"


class _Group(click.Group):
    """Turns library errors into one line on stderr and exit 1 (traceback with --verbose), and
    usage errors into one line and exit 2 (click would print the usage block first)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # a bare ``edgeattn``: the help, as click gives it
                click.echo(exc.format_message(), err=True)
                sys.exit(exc.exit_code)
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(f"edgeattn: error: {exc.format_message()}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"edgeattn: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("edgeattn: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (EdgeattnError, OSError) as exc:
            if ctx.obj and ctx.obj.get("verbose"):
                raise
            message = str(exc).strip().splitlines()
            click.echo(f"edgeattn: error: {message[0] if message else type(exc).__name__}", err=True)
            for extra in message[1:]:
                click.echo(extra, err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edgeattn")
@click.option("-v", "--verbose", is_flag=True, help="Log details and show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """edgeattn: a transformer from PyTorch to ONNX Runtime, with parity proven at every step."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not verbose:  # long work says what it is doing, in a terminal or a log file
        _phases_log.setLevel(logging.INFO)


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _needs(extra: str, *modules: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command that runs only where the ``extra`` install (or the ``modules`` of it the command
    imports) is present: elsewhere one line saying which extra to install, and exit 1."""

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        @functools.wraps(command)
        def checked(*args: Any, **kwargs: Any) -> Any:
            require_extra(extra, f"'edgeattn {command.__name__.replace('_', '-')}'", modules)
            return command(*args, **kwargs)

        return checked

    return wrap


_provider_option = click.option(
    "--provider-option",
    "provider_specs",
    multiple=True,
    help="NAME:KEY=VALUE (or KEY=VALUE for the first of --providers); repeatable.",
)


def _provider_options(default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--providers (``default`` says what runs without it) and --provider-option."""
    providers = click.option(
        "--providers",
        default=None,
        help=f"Comma-separated ONNX Runtime providers, built in or installed as plugins ({default}).",
    )
    return lambda command: providers(_provider_option(command))


_calibration_option = click.option(
    "--calibration",
    "calibration_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Calibration sequences for "
    + ", ".join(p.name for p in PRECISIONS.values() if p.calibrated)
    + " (and the GPTQ fit of "
    + ", ".join(p.name for p in PRECISIONS.values() if p.fitted)
    + " where the model's family fits), one per line: text when the model has a tokenizer, else token ids "
    "(default: drawn from the model's vocabulary; GPTQ: the held-out text the gate does not measure).",
)
_heldout_option = click.option(
    "--heldout",
    "heldout_file",
    type=click.Path(path_type=Path),
    default=None,
    help="The accuracy gate's held-out inputs, one per line: text when the model has a tokenizer, else token ids "
    "(default: the task's own, else drawn from the model's vocabulary); a speech model's: a folder of audio files, "
    "an audio file, or a text file naming them. Keep them apart from --calibration.",
)
_calibration_method_option = click.option(
    "--calibration-method",
    type=click.Choice(CALIBRATION_METHODS),
    default=CALIBRATION_METHODS[0],
    show_default=True,
    help="How " + ", ".join(p.name for p in PRECISIONS.values() if p.calibrated) + " finds its ranges.",
)

_static_form_option = click.option(
    "--static-form",
    type=click.Choice(["auto", "fused", "plain"]),
    default=None,
    help="What int8-static's attention, encoder and cross_kv graphs are made from: fused (ONNX Runtime's "
    "MultiHeadAttention, the faster on ONNX Runtime), plain (standard operators only, for other engines: "
    "OpenVINO runs it 3.5-5x faster than the fused form), or auto (default): plain for the graphs the runtime "
    "puts on OpenVINO on this machine (an export without decoders, where OpenVINO runs), else fused.",
)

_kv_cache_option = click.option(
    "--kv-cache",
    type=click.Choice(["int8", "float32"]),
    default=None,
    help="A language model's int8 and int4 key/value cache (default int8: decoding reads half the bytes, "
    "1.6x as fast at 2,048 tokens of context; prompts over ~1,000 tokens take up to 1.7x as long). float32 for "
    "long prompts with short answers.",
)


def _shapes(value: str | None) -> tuple[tuple[int, int], ...] | None:
    """``1x128,32x128`` as ((1, 128), (32, 128)); ValueError on anything else."""
    if value is None:
        return None
    shapes = []
    for item in _split(value) or []:
        batch, _, seq = item.lower().partition("x")
        shapes.append((int(batch), int(seq)))
    if not shapes or any(b < 1 or s < 1 for b, s in shapes):
        raise ValueError(f"bad shapes {value!r}")
    return tuple(shapes)


def _precision_options(
    precisions: list[str],
    calibration_method: str,
    calibration_file: Path | None,
    allow_degraded: bool,
    config: Any,
    tokenizer: Any,
    heldout_file: Path | None = None,
    static_form: str | None = None,
    kv_cache: str | None = None,
    settings: dict[str, Any] | None = None,
) -> Any:
    """PrecisionOptions from the command's flags; calibration and held-out files are read (and
    checked) here."""
    from edgeattn.exporters.calibration import read_sequences_file
    from edgeattn.exporters.precision_builds import PrecisionOptions

    options = PrecisionOptions(calibration_method=calibration_method, allow_degraded=allow_degraded,
                               tokenizer=tokenizer)  # fmt: skip
    if static_form is not None:
        if not any(get_precision(p).plain_form for p in precisions):
            formed = [p.name for p in PRECISIONS.values() if p.plain_form]
            raise click.UsageError(f"--static-form is for {', '.join(formed)}; add it to --precision")
        options.static_form = static_form
    if kv_cache is not None:
        from edgeattn.runtime.families import family_of

        if not any(family_of(config).caches(p, "int8") for p in precisions):
            raise click.UsageError("--kv-cache is for a language model's int8 and int4; add one to --precision")
        options.kv_cache = kv_cache
    if calibration_file is not None:
        from edgeattn.runtime.families import family_of

        family = family_of(config)
        calibrated = [p for p in PRECISIONS if family.calibrated(p)]
        if not any(family.calibrated(p) for p in precisions):
            raise click.UsageError(f"--calibration is for {', '.join(calibrated)} of a {family.name} model; "
                                   "add one to --precision")  # fmt: skip
        options.calibration_data = read_sequences_file(calibration_file, config, tokenizer)
        options.calibration_source = f"file {calibration_file.name}"
    if heldout_file is not None:
        if not any(get_precision(p).gated for p in precisions):
            gated = [p.name for p in PRECISIONS.values() if p.gated]
            raise click.UsageError(f"--heldout is for gated precisions ({', '.join(gated)}); add one to --precision")
        from edgeattn.runtime.families import family_of, resolve

        reader = family_of(config).heldout_reader
        if reader is not None:
            options.heldout_features, options.heldout_prompt = resolve(reader)(heldout_file, settings)
        else:
            options.heldout_data = read_sequences_file(heldout_file, config, tokenizer, what="held-out")
        options.heldout_source = f"{'folder' if heldout_file.is_dir() else 'file'} {heldout_file.name}"
    return options


@cli.command()
@click.option(
    "-o",
    "--output",
    "output",
    default=DEFAULT_OUTPUT,
    show_default=True,
    type=click.Path(path_type=Path),
    help="Export directory to write.",
)
@click.option("--preset", default=None, help="Built-in model preset (default: demo).")
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Model config JSON file (instead of a preset).",
)
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    default=None,
    help="Weights (.safetensors); its config comes from the file unless --config is given.",
)
@click.option(
    "--from-hf",
    "from_hf",
    type=click.Path(path_type=Path),
    default=None,
    help="A local Hugging Face folder (BERT, RoBERTa, DistilBERT: bare, sequence or token classification; "
    "T5, Flan-T5, mT5 for generation; GPT-2, Llama, Qwen2, Qwen3, Phi-3 language models).",
)
@click.option(
    "--task",
    type=click.Choice(list(all_tasks())),
    default=None,
    help="With --from-hf: what the model is for (default: what its config.json says).",
)
@click.option(
    "--graphs",
    default=None,
    help="Comma-separated graphs: " + ",".join(offered_graphs()) + " (default: all the model's family has).",
)
@click.option(
    "--opset", default=17, show_default=True, type=int, help="ONNX opset (above 20 uses the dynamo exporter)."
)
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed of the random weights when no checkpoint is given."
)
@click.option(
    "--no-verify",
    is_flag=True,
    help="Skip the parity checks: an imported folder against transformers, the graphs against eager PyTorch.",
)
@click.option(
    "--no-check",
    is_flag=True,
    help="Leave out the check of an imported folder against transformers' own reading of it (the manifest "
    "records that it was left out).",
)
@click.option(
    "--check-python",
    type=click.Path(dir_okay=False),
    help="A Python whose transformers reads the folder (one of its generation: transformers 5 for a folder "
    "transformers 5 saved) to check the import with, when the installed transformers cannot "
    "(default: $EDGEATTN_TRANSFORMERS_PYTHON).",
)
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
@click.option(
    "--precision",
    "precisions",
    default=FP32,
    show_default=True,
    help=f"Comma-separated: {','.join(PRECISIONS)} ({FP32} is always written).",
)
@_calibration_method_option
@_calibration_option
@_heldout_option
@_static_form_option
@_kv_cache_option
@click.option(
    "--allow-degraded", is_flag=True, help="Keep precisions that miss their accuracy thresholds, marked degraded."
)
@_needs("export")
def export(
    output: Path,
    preset: str | None,
    config_file: Path | None,
    checkpoint: Path | None,
    from_hf: Path | None,
    task: str | None,
    graphs: str | None,
    opset: int,
    seed: int,
    no_verify: bool,
    no_check: bool,
    check_python: str | None,
    force: bool,
    precisions: str,
    calibration_method: str,
    calibration_file: Path | None,
    heldout_file: Path | None,
    static_form: str | None,
    kv_cache: str | None,
    allow_degraded: bool,
) -> None:
    """Export the model's attention, encoder and decoder graphs to ONNX, verified."""
    from edgeattn.exporters.export import export_model
    from edgeattn.sources import resolve_model

    if preset and config_file:
        raise click.UsageError("give --preset or --config, not both")
    if preset and checkpoint:
        raise click.UsageError("--checkpoint carries its own config; use --config to override it, not --preset")
    if from_hf is not None and (preset or config_file or checkpoint):
        raise click.UsageError(
            "--from-hf brings its own config and weights; leave out --preset, --config, --checkpoint"
        )
    if task is not None and from_hf is None:
        raise click.UsageError("--task goes with --from-hf")
    with phase(f"importing {from_hf}" if from_hf is not None else "building the model"):
        source = resolve_model(preset, config_file, checkpoint, seed, from_hf=from_hf, task=task)
    import_check = None
    if from_hf is not None:
        from edgeattn.runtime.manifest import ImportCheck

        if no_verify or no_check:
            why = "left out by --no-check" if no_check else "left out by --no-verify"
            import_check = ImportCheck("", why, None)
            click.echo(f"import check against transformers {why}")
        else:
            from edgeattn.hf_reference import require_transformers_agreement

            with phase("checking the import against transformers"):
                check = require_transformers_agreement(source, check_python)
            click.echo(f"import {check.line()}")
            import_check = ImportCheck(check.transformers_version, check.line(), check.passed)
    options = _precision_options(
        _split(precisions) or [], calibration_method, calibration_file, allow_degraded, source.model.config,
        source.tokenizer, heldout_file, static_form, kv_cache, source.settings,
    )  # fmt: skip
    # An earlier export in the output directory may be replaced without --force.
    replace = force or (output / "manifest.json").is_file()
    result = export_model(
        source.model,
        output,
        graphs=_split(graphs),
        opset=opset,
        verify=not no_verify,
        force=replace,
        progress=sys.stderr.isatty(),
        precisions=_split(precisions),
        precision_options=options,
        **source.export_fields(),
        import_check=import_check,
    )
    if result.report is not None:
        click.echo(result.report.table())
    for gate in result.gates.values():
        click.echo(gate.table())
    click.echo(f"exported {', '.join(result.graphs)} to {result.out_dir} in {result.seconds:.1f} s")


@cli.command()
@click.argument("export_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
@click.option(
    "--precision",
    type=click.Choice(float32_precisions()),
    default=FP32,
    show_default=True,
    help="Which float32 graphs to check.",
)
@_needs("export")
def verify(export_dir: Path, as_json: bool, precision: str) -> None:
    """Compare an export with eager PyTorch on fresh shapes; exit 1 on any mismatch."""
    from edgeattn.exporters.verify import verify_export

    report = verify_export(export_dir, progress=sys.stderr.isatty(), precision=precision)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.table())
    if not report.passed:
        click.echo("edgeattn: error: verification failed", err=True)
        sys.exit(1)


@cli.command()
@click.argument("export_dir", type=click.Path(path_type=Path))
@click.option("--precision", "precisions", required=True, help=f"Comma-separated: {','.join(reduced_precisions())}.")
@_calibration_method_option
@_calibration_option
@_heldout_option
@_static_form_option
@_kv_cache_option
@click.option("--allow-degraded", is_flag=True, help="Keep precisions that miss their thresholds, marked degraded.")
@_needs("export")
def quantize(
    export_dir: Path,
    precisions: str,
    calibration_method: str,
    calibration_file: Path | None,
    heldout_file: Path | None,
    static_form: str | None,
    kv_cache: str | None,
    allow_degraded: bool,
) -> None:
    """Add reduced-precision graphs to an export, each gated against eager float32."""
    from edgeattn.exporters.export import quantize_export
    from edgeattn.runtime.manifest import check_file, read_manifest
    from edgeattn.runtime.tokenizer import load_tokenizer
    from edgeattn.sources import heldout_for_task

    manifest = read_manifest(export_dir)
    heldout = heldout_for_task(manifest.task)
    tokenizer = None if manifest.tokenizer is None else load_tokenizer(check_file(export_dir, manifest.tokenizer))
    settings = None
    if manifest.settings is not None:
        from edgeattn.runtime.jsonfile import read_json_object

        settings = read_json_object(check_file(export_dir, manifest.settings))
    options = _precision_options(
        _split(precisions) or [], calibration_method, calibration_file, allow_degraded, manifest.config, tokenizer,
        heldout_file, static_form, kv_cache, settings,
    )  # fmt: skip
    gates = quantize_export(
        export_dir, _split(precisions) or [], options, heldout_texts=heldout, progress=sys.stderr.isatty()
    )  # fmt: skip
    for gate in gates.values():
        click.echo(gate.table())
    click.echo(f"added {', '.join(gates)} to {export_dir}")


@cli.command()
@click.argument("export_dir", type=click.Path(path_type=Path))
@click.option("--target", type=click.Choice(["mobile", "web", "node"]), required=True,
              help="mobile: ORT-format files and the operator config of a reduced ONNX Runtime build; web, node: "
              "an encoder, seq2seq, language, speech or vision model with its tokenizer and an ES module for "
              "onnxruntime-web / onnxruntime-node.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Where to write the bundle.")
@click.option("--precision", "precisions", default=None,
              help="Comma-separated precisions to package (default: mobile, every CPU precision the export holds; "
              "web and node, the gated int8 of an encoder, int4 else int8 of a language model, else fp32).")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
@click.option("--check-with", "node_modules", type=click.Path(path_type=Path), default=None,
              help="web, node: a node_modules folder with onnxruntime-node and/or onnxruntime-web; the bundle is "
              "run under Node.js on each and checked against the Python runtime (a table, kept in bundle.json).")
@_needs("export", "onnx")
def package(export_dir: Path, target: str, output: Path, precisions: str | None, force: bool,
            node_modules: Path | None) -> None:  # fmt: skip
    """Package an export for a device: mobile (proven to load and to answer as the export does) or a
    browser / Node.js bundle of an encoder, a seq2seq model or a language model (its graphs linted
    against the targets' ONNX Runtime first). Needs onnx, not torch."""
    if target == "mobile":
        from edgeattn.exporters.mobile import package_mobile

        if node_modules is not None:
            raise click.UsageError("--check-with is for the web and node targets (a mobile bundle is checked always)")
        bundle = package_mobile(export_dir, output, _split(precisions), force=force, progress=sys.stderr.isatty())
        click.echo(bundle.table())
    else:
        from edgeattn.exporters.web import check_and_record, package_web, parity_table

        bundle = package_web(export_dir, output, target, _split(precisions), force=force)
        if node_modules is not None:
            click.echo(parity_table(check_and_record(output, export_dir, node_modules)))
    click.echo(f"wrote {output} ({target}: {len(bundle.files)} files, {bundle.total_bytes / 1e6:.2f} MB)")


@cli.command()
@click.argument("export_dir", type=click.Path(path_type=Path))
@click.option("--input", "input_path", type=click.Path(path_type=Path), required=True,
              help="JSON lines (an object a row: an optional id, the task's input, e.g. text, and its settings), "
              "Parquet, a text file (a row a line) or a folder of images or audio (a row a file).")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="A Parquet dataset folder: a part per chunk of rows, each row with its id (a rerun resumes).")
@click.option("--task", default=None, help="The served task (default: the export's own).")
@click.option("--precision", default=None, help="The precision to run (default: fp32).")
@click.option("--chunk-rows", type=int, default=256, show_default=True, help="Rows a part holds.")
@click.option("--batch-rows", type=int, default=16, show_default=True, help="Rows the model answers at a time.")
@click.option("--ray", "on_ray", is_flag=True, help="Run on a Ray cluster with Ray Data.")
@click.option("--address", default=None,
              help="--ray: the cluster to join (auto: the one 'ray start' began; default: a local one for the job).")
@click.option("--concurrency", type=int, default=2, show_default=True, help="--ray: model actors.")
@click.option("--threads", type=int, default=1, show_default=True, help="--ray: threads (and CPUs) an actor takes.")
def batch(export_dir: Path, input_path: Path, output: Path, task: str | None, precision: str | None,
          chunk_rows: int, batch_rows: int, on_ray: bool, address: str | None, concurrency: int,
          threads: int) -> None:  # fmt: skip
    """Answer every row of an input with an export (embed, classify, tag, generate, chat, transcribe,
    images) into Parquet parts; resumable, each row written once, in this process or on Ray."""
    progress = sys.stderr.isatty()
    if on_ray:
        require_extra("ray", "'edgeattn batch --ray'")
        from edgeattn.serving.ray_batch import run_batch_on_ray

        result = run_batch_on_ray(export_dir, input_path, output, task, chunk_rows, batch_rows, precision,
                                  concurrency, threads, address, progress)  # fmt: skip
    else:
        require_extra("batch", "'edgeattn batch'")
        from edgeattn.serving.batch import run_batch

        result = run_batch(export_dir, input_path, output, task, chunk_rows, batch_rows, precision, progress)
    click.echo(f"{result.rows} rows in {result.chunks} parts: {result.written} written, {result.skipped} already "
               f"there, {result.errors} row(s) with an error; {result.rows_per_s:.1f} rows/s -> {result.out_dir}")


@cli.command("serve-web")
@click.argument("bundle_dir", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True)
@click.option("--ort-dist", type=click.Path(path_type=Path), default=None,
              help="onnxruntime-web's dist folder to serve the runtime from (default: the page loads it from "
              "jsDelivr).")
def serve_web(bundle_dir: Path, host: str, port: int, ort_dist: Path | None) -> None:
    """Serve a web bundle's page (type text, see labels, entities, nearest texts or a language model's
    streamed continuation, load and run times; wasm or WebGPU), cross-origin isolated so
    onnxruntime-web may use threads. Stops on Ctrl-C."""
    from edgeattn.serving.web_page import WebPageServer

    server = WebPageServer(bundle_dir, host, port, ort_dist)
    click.echo(f"serving {bundle_dir} at {server.url}; Ctrl-C stops")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("stopping")
    finally:
        server.server.server_close()


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def providers(as_json: bool) -> None:
    """The ONNX Runtime providers this machine can run: built in, and installed plugins with their devices."""
    import onnxruntime as ort

    from edgeattn.runtime.providers import (
        OPENVINO,
        built_in_providers,
        describe_plugins,
        onnxruntime_package,
        why_unavailable,
    )

    plugins = describe_plugins()
    reasons = {name: why_unavailable(name) for name in plugins}
    for name, info in plugins.items():
        info["usable"] = reasons[name] is None
    if as_json:
        click.echo(json.dumps({"onnxruntime": ort.__version__, "package": onnxruntime_package(),
                               "built_in": built_in_providers(), "plugins": plugins}, indent=2))  # fmt: skip
        return
    click.echo(f"onnxruntime {ort.__version__} ({onnxruntime_package()}), "
               f"built in: {', '.join(built_in_providers())}")  # fmt: skip
    if not plugins:
        built_in = OPENVINO in built_in_providers()
        click.echo(
            "plugins: none installed"
            + ("" if built_in else " (pip install onnxruntime-ep-..., e.g. 'edgeattn[openvino]')")
        )
    for name, info in plugins.items():
        devices = ", ".join(info["devices"]) or "none on this machine"
        click.echo(f"plugin {name} ({info['package']}): devices {devices}")
        if reasons[name] is not None:
            click.echo(f"  {reasons[name]}")


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@_needs("export", "onnx")
def inspect(path: Path, as_json: bool) -> None:
    """Describe an ONNX file (any) or an edgeattn export directory."""
    from edgeattn.exporters.inspect_onnx import format_report, inspect_path, to_json

    info = inspect_path(path)
    click.echo(to_json(info) if as_json else format_report(info))


@cli.command()
@click.argument("export_dir", type=click.Path(path_type=Path))
@click.argument("text", required=False)
@click.option("--file", "input_file", type=click.Path(path_type=Path), help="Inputs, one per line.")
@click.option("--precision", default=FP32, show_default=True, help=f"One of {', '.join(PRECISIONS)} the export holds.")
@click.option("--threads", type=int, default=None)
@click.option("--cpu", is_flag=True, help="Use ONNX Runtime's CPU provider even where CUDA or OpenVINO is available.")
@_provider_options("e.g. OpenVINOExecutionProvider; default: chosen per graph, one put on OpenVINO said on stderr")
@click.pass_context
def run(ctx: click.Context, export_dir: Path, text: str | None, input_file: Path | None, precision: str,
        threads: int | None, cpu: bool, providers: str | None, provider_specs: tuple[str, ...],
        **values: Any) -> None:  # fmt: skip
    """Run an export on TEXT (or --file) and print its answers. Needs no torch.

    A language model continues each text (an instruct model answers it as a chat message); an
    encoder-decoder generates; an encoder tags entities, classifies or embeds, as its task says; a
    speech model transcribes the audio files named (WAV, FLAC, OGG, MP3). The other options are
    each family's: one its export's family does not take is refused.
    """
    from edgeattn.runtime import load
    from edgeattn.runtime.families import resolve
    from edgeattn.runtime.providers import OPENVINO, provider_name

    if (text is None) == (input_file is None):
        raise click.UsageError("give one TEXT argument or --file, not both or neither")
    if input_file is not None:
        try:
            texts = [line.strip() for line in input_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as exc:
            raise click.FileError(str(input_file), exc.strerror) from exc
        except UnicodeDecodeError as exc:
            raise click.FileError(str(input_file), f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                                                   f"offset {exc.start})") from exc  # fmt: skip
        if not texts:
            raise click.UsageError(f"{input_file} holds no input lines")
    else:
        texts = [text or ""]
    model = load(export_dir, providers=_providers(cpu, providers, provider_specs), threads=threads,
                 precision=precision)  # fmt: skip
    for graph, engine in model.engines.items():
        if not engine.requested and provider_name(engine.providers[0]) == OPENVINO:
            click.echo(f"{graph} graph on {engine.describe()} (--cpu: ONNX Runtime's CPU provider)", err=True)
    family = model.family
    if family.run_hook is None:
        raise click.UsageError(f"edgeattn run does not take {family.name} exports")
    hook = resolve(family.run_hook)
    takes = {option.name for option in hook.options}
    given = [p.opts[0] for p in ctx.command.params if p.name in values and p.name not in takes
             and ctx.get_parameter_source(p.name) is not click.core.ParameterSource.DEFAULT]  # fmt: skip
    if given:
        flags = " ".join(sorted(o.opts[0] for o in hook.options))
        raise click.UsageError(f"{', '.join(given)}: not for a {family.name} export (its options: {flags})")
    hook.answer(model, texts, values)


def _run_options() -> None:
    """Give ``run`` every family's options (each family's record names its :class:`RunHook`)."""
    from edgeattn.run_options import family_options
    from edgeattn.runtime.families import FAMILIES, resolve

    hooks = [resolve(f.run_hook) for f in FAMILIES.values() if f.run_hook is not None]
    run.params.extend(family_options(hooks))


_run_options()


@cli.command()
@click.argument("export_dir", type=click.Path(path_type=Path))
@click.option("--system", default=None, help="The system message the conversation starts with.")
@click.option("--max-new-tokens", type=int, default=None, help="The longest answer (default: 256 tokens).")
@click.option("--strategy", type=click.Choice(["greedy", "sample"]), default="greedy", show_default=True)
@click.option("--temperature", default=0.7, show_default=True)
@click.option("--top-k", default=0, show_default=True)
@click.option("--top-p", default=0.9, show_default=True)
@click.option("--repetition-penalty", default=1.0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--precision", default=FP32, show_default=True, help=f"One of {', '.join(PRECISIONS)} the export holds.")
@click.option("--threads", type=int, default=None)
def chat(export_dir: Path, system: str | None, max_new_tokens: int | None, strategy: str, temperature: float,
         top_k: int, top_p: float, repetition_penalty: float, seed: int | None, precision: str,
         threads: int | None) -> None:  # fmt: skip
    """A conversation with a language model's export in the terminal (its chat template), one message
    a line; the conversation and its cache are kept between turns. /reset starts again, /exit (or
    end of input) ends. Needs no torch."""
    from edgeattn.runtime import load

    model = load(export_dir, threads=threads, precision=precision)
    if not callable(getattr(model, "conversation", None)):
        raise click.UsageError(f"{export_dir} is a {model.family.name} export; edgeattn chat talks to language models")
    if model.chat_template is None:
        raise click.UsageError(f"{export_dir} has no chat template; use edgeattn run {export_dir} TEXT --raw")
    options: dict[str, Any] = {"strategy": strategy, "repetition_penalty": repetition_penalty}
    if strategy == "sample":
        options.update(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    conversation = model.conversation(system)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            click.echo("> ", nl=False)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            break
        if not line.strip():
            continue
        if line.strip() == "/reset":
            conversation = model.conversation(system)
            continue
        for piece in conversation.say(line.rstrip("\n"), max_new_tokens=max_new_tokens, **options):
            click.echo(piece, nl=False)
        click.echo()


def _providers(cpu: bool, providers: str | None, specs: tuple[str, ...]) -> list[Any] | None:
    """The providers ``--cpu`` / ``--providers`` / ``--provider-option`` ask for (None: the default)."""
    from edgeattn.runtime.providers import parse_provider_options
    from edgeattn.runtime.session import CPU

    if cpu and providers is not None:
        raise click.UsageError("give --cpu or --providers, not both")
    names = [CPU] if cpu else _split(providers) if providers is not None else None
    if names is None:
        if specs:
            raise click.UsageError("--provider-option needs --providers")
        return None
    return parse_provider_options(names, specs)


_SERVE_TASKS = click.Choice(list(all_tasks()))


def _serving_options(func: Any) -> Any:
    for option in reversed([
        click.option("--precision", default=FP32, show_default=True,
                     help=f"One of {', '.join(PRECISIONS)} the export holds."),
        click.option("--max-batch-size", default=8, show_default=True,
                     help="Triton's max_batch_size (0: no batching)."),
        click.option("--max-queue-delay-us", default=1000, show_default=True,
                     help="How long the dynamic batcher waits to fill a batch."),
        click.option("--instances", default=1, show_default=True, help="Model instances (instance_group count)."),
        click.option("--dynamic-batching/--no-dynamic-batching", default=True, show_default=True,
                     help="Gather concurrent requests into one batch."),
        click.option("--name", default=None, help="The model name clients call (default: the export's name)."),
        click.option("--task", type=_SERVE_TASKS, default=None, help="What to serve (default: what the head says)."),
    ]):  # fmt: skip
        func = option(func)
    return func


@cli.command()
@click.argument("export_dir", type=click.Path(path_type=Path))
@click.argument("repository", type=click.Path(path_type=Path))
@_serving_options
@click.option(
    "--kind",
    type=click.Choice(["cpu", "gpu"]),
    default="cpu",
    show_default=True,
    help="Where the graph models' instances run.",
)
@click.option(
    "--accelerator",
    type=click.Choice(["cuda", "tensorrt"]),
    default=None,
    help="GPU execution accelerator of the graph models (with --kind gpu).",
)
@click.option("--fp16", is_flag=True, help="TensorRT in float16 (with --accelerator tensorrt).")
@click.option(
    "--per-tensor-scales",
    is_flag=True,
    help="int8: keep one activation scale per batch (faster; answers then depend on batch-mates).",
)
@click.option(
    "--graphs",
    type=click.Choice(["bls", "in-process"]),
    default=None,
    help="The end-to-end model calls the graph models through Triton (bls, the default), or runs them itself "
    "(in-process; always for a language model, whose graph keeps its cache in place).",
)
@_needs("export", "onnx")
def triton(export_dir: Path, repository: Path, precision: str, max_batch_size: int, max_queue_delay_us: int,
           instances: int, dynamic_batching: bool, name: str | None, task: str | None, kind: str,
           accelerator: str | None, fp16: bool, per_tensor_scales: bool, graphs: str | None) -> None:  # fmt: skip
    """Write a Triton Inference Server model repository for an export. Needs onnx, not torch.

    One ONNX Runtime backend model per graph the task needs, and the task end to end (text in,
    answers out) as a Python-backend model; models that generate also get a streaming model. A
    language model's end-to-end models run its graph themselves, from the export they carry.
    """
    from edgeattn.serving.repository import RepositoryOptions, write_repository

    options = RepositoryOptions(precision=precision, max_batch_size=max_batch_size, instances=instances, kind=kind,
                                accelerator=accelerator, fp16=fp16, max_queue_delay_us=max_queue_delay_us,
                                name=name, task=task, graphs=graphs, per_tensor_scales=per_tensor_scales,
                                dynamic_batching=dynamic_batching)  # fmt: skip
    repo = write_repository(export_dir, repository, options)
    click.echo(f"wrote {repo.path}: {', '.join(f'{m} ({b})' for m, b in repo.models.items())}")
    click.echo(f"start: tritonserver --model-repository {repo.path}   (see {repo.path / 'README.md'})")


@cli.command()
@click.argument("exports", nargs=-1, required=True, type=click.Path(path_type=Path))
@_serving_options
@click.option("--api", type=click.Choice(["triton", "openai"]), default="triton", show_default=True,
              help="Triton's protocols (one export), or an OpenAI-compatible HTTP API (every export, by name).")
@click.option("--api-key", default=None, help="With --api openai: the bearer token every request must carry.")
@click.option("--max-rows", default=8, show_default=True,
              help="With --api openai: a language model's concurrent generations in its batch (more wait).")
@click.option("--ray", "on_ray", is_flag=True,
              help="With --api openai: each export a Ray Serve deployment behind one ingress, on a Ray cluster.")
@click.option("--address", default=None,
              help="--ray: the cluster to join (auto: the one 'ray start' began; default: a local one, stopped after).")
@click.option("--min-replicas", type=int, default=1, show_default=True, help="--ray: replicas an export keeps.")
@click.option("--max-replicas", type=int, default=1, show_default=True,
              help="--ray: replicas an export may scale to under load (one more when each holds --max-rows requests).")
@click.option("--threads", type=int, default=1, show_default=True,
              help="--ray: threads (and CPUs reserved) a replica takes.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", default=8000, show_default=True, help="HTTP port.")
@click.option("--grpc-port", default=8001, show_default=True)
@click.option("--metrics-port", default=8002, show_default=True)
@click.option(
    "--repository",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep the Triton repository here (default: a temporary directory).",
)
@_needs("export", "onnx")
def serve(exports: tuple[Path, ...], precision: str, max_batch_size: int, max_queue_delay_us: int, instances: int,
          dynamic_batching: bool, name: str | None, task: str | None, api: str, api_key: str | None, max_rows: int,
          on_ray: bool, address: str | None, min_replicas: int, max_replicas: int, threads: int,
          host: str, port: int, grpc_port: int, metrics_port: int, repository: Path | None) -> None:  # fmt: skip
    """Serve exports: behind a Triton Inference Server (HTTP, gRPC, metrics; one export), or as an
    OpenAI-compatible API (--api openai: chat and completions with continuous batching for language
    models, embeddings for encoders and vision models, audio transcriptions and translations for
    speech models; every export by its directory's name), in this process or, with --ray, as Ray
    Serve replicas on a Ray cluster (each export scaled between --min-replicas and --max-replicas).

    Triton's end-to-end model runs the graphs in its own process with dynamic batching and needs
    the serve extra (nvidia-pytriton's server); the OpenAI API needs aiohttp, and the ray extra
    with --ray. None needs torch. Stops on Ctrl-C.
    """
    import signal
    import tempfile

    if on_ray and api != "openai":
        raise click.UsageError("--ray serves the OpenAI API: add --api openai")
    if on_ray:
        require_extra("ray", "'edgeattn serve --ray'")
        from edgeattn.serving.ray_serve import RayServeOptions, deploy

        options = RayServeOptions(precision=precision, max_rows=max_rows, api_key=api_key, threads=threads,
                                  min_replicas=min_replicas, max_replicas=max_replicas)  # fmt: skip
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _interrupt)
        try:
            with deploy(list(exports), options, host, port, address) as running:
                click.echo(f"serving {', '.join(e.name for e in exports)} on Ray Serve at {running.url} "
                           f"({min_replicas}-{max_replicas} replica(s) of {threads} thread(s) each); Ctrl-C stops")
                signal.pause()
        except KeyboardInterrupt:
            click.echo("stopping")
        return
    if api == "openai":
        from edgeattn.serving.openai_api import run_api

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _interrupt)
        try:
            run_api(list(exports), host, port, api_key, max_rows, precision,
                    ready=lambda url: click.echo(f"serving {', '.join(e.name for e in exports)} at {url}; "
                                                 "Ctrl-C stops"))  # fmt: skip
        except KeyboardInterrupt:
            click.echo("stopping")
        return
    if len(exports) != 1:
        raise click.UsageError("Triton serves one export at a time; give one, or --api openai for several")
    export_dir = exports[0]
    from edgeattn.serving.repository import RepositoryOptions, write_repository
    from edgeattn.serving.triton_server import TritonServer

    options = RepositoryOptions(precision=precision, max_batch_size=max_batch_size, instances=instances,
                                max_queue_delay_us=max_queue_delay_us, name=name, task=task,
                                graphs="in-process", dynamic_batching=dynamic_batching)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="edgeattn-serve-") as work:
        repo = write_repository(export_dir, repository or Path(work) / "repository", options)
        models = [m for m, backend in repo.models.items() if backend == "python"]
        server = TritonServer(repo.path, models, host=host, http_port=port, grpc_port=grpc_port,
                              metrics_port=metrics_port, log_file=Path(work) / "tritonserver.log")  # fmt: skip
        for signum in (signal.SIGINT, signal.SIGTERM):  # also where a background start left SIGINT ignored
            signal.signal(signum, _interrupt)
        try:  # an interrupt while starting stops the server too
            with server:
                click.echo(f"serving {', '.join(models)} ({repo.task}, {precision}): HTTP {server.http_url}, "
                           f"gRPC {server.grpc_url}, metrics {server.metrics_url}; Ctrl-C stops")  # fmt: skip
                code = server.wait()
        except KeyboardInterrupt:
            click.echo("stopping")
            server.stop()
            return
        raise click.ClickException(f"the Triton server stopped (exit code {code})")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@cli.command()
@click.argument("export_dir", required=False, type=click.Path(path_type=Path))
@click.option("--preset", default=None, help="Export this preset first (default without EXPORT_DIR: demo).")
@click.option("--batch", "batches", default="1,8", show_default=True, help="Comma-separated batch sizes.")
@click.option("--seq", "seqs", default="32,128,512", show_default=True, help="Comma-separated sequence lengths.")
@click.option(
    "--shapes", default=None, help="Comma-separated BATCHxSEQ shapes (e.g. 1x128,32x128) instead of --batch/--seq."
)
@click.option("--threads", default=2, show_default=True, type=int)
@_provider_options("default: the CPU provider")
@click.option("--no-openvino", is_flag=True, help="Skip the OpenVINO variants timed where OpenVINO runs on this CPU.")
@click.option(
    "--io-binding/--no-io-binding",
    default=None,
    help="Keep ONNX Runtime inputs and outputs on the device (default: on CUDA only).",
)
@click.option("--no-cuda-graph", is_flag=True, help="Skip the CUDA-graph variants on the CUDA provider.")
@click.option("--tf32", is_flag=True, help="Let CUDA float32 matrix products use TF32 (faster, ~1e-3 error).")
@click.option(
    "--precision",
    "precisions",
    default=",".join(graph_precisions()),
    show_default=True,
    help="Exported precisions to time (those the export holds; GPU precisions on GPU providers only; bf16 is "
    "timed as fp32 on OpenVINO with a bf16 hint).",
)
@_static_form_option
@click.option("--repeats", default=20, show_default=True, type=int)
@click.option("--no-eager", is_flag=True, help="Skip the eager PyTorch variants.")
@click.option(
    "--no-peers",
    is_flag=True,
    help="Skip the peers: transformers and Optimum on an imported checkpoint's folder, else a Hugging Face BERT.",
)
@click.option(
    "--hf-folder",
    type=click.Path(path_type=Path),
    default=None,
    help="The Hugging Face folder an imported export came from (default: the one its manifest names).",
)
@click.option("--generation", is_flag=True, help="Also run the generation benchmark (encoder-decoder models).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None, help="Write a PNG plot.")
@_needs("export")
def bench(
    export_dir: Path | None,
    preset: str | None,
    batches: str,
    seqs: str,
    shapes: str | None,
    threads: int,
    providers: str | None,
    provider_specs: tuple[str, ...],
    no_openvino: bool,
    io_binding: bool | None,
    no_cuda_graph: bool,
    tf32: bool,
    precisions: str,
    static_form: str | None,
    repeats: int,
    no_eager: bool,
    no_peers: bool,
    hf_folder: Path | None,
    generation: bool,
    json_path: Path | None,
    plot_path: Path | None,
) -> None:
    """Latency of eager PyTorch and every exported precision, side by side (a language model's export:
    prefill and decode of every precision it holds)."""
    from edgeattn.benchmark.run import BenchOptions, run_benchmark
    from edgeattn.runtime.families import family_of, resolve
    from edgeattn.runtime.manifest import read_manifest

    family = family_of(read_manifest(export_dir).config) if export_dir is not None else None
    if family is not None and family.bencher is not None:  # a family timed its own way
        lengths, rows = tuple(int(s) for s in seqs.split(",")), tuple(int(b) for b in batches.split(","))
        result = resolve(family.bencher)(export_dir, lengths, rows, threads, tuple(_split(precisions) or []))
        click.echo(result.table())
        if json_path is not None:
            json_path.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
            click.echo(f"wrote {json_path}")
        return

    if export_dir is not None and preset is not None:
        raise click.UsageError("give an EXPORT_DIR or --preset, not both")
    if export_dir is not None and static_form is not None:
        raise click.UsageError("--static-form is for the export a --preset run makes; an EXPORT_DIR has its own")
    try:
        options = BenchOptions(
            batches=tuple(int(b) for b in batches.split(",")), seqs=tuple(int(s) for s in seqs.split(",")),
            threads=threads, precisions=tuple(_split(precisions) or []),
            repeats=repeats, eager=not no_eager, generation=generation, peers=not no_peers,
            shapes=_shapes(shapes), io_binding=io_binding, cuda_graph=not no_cuda_graph, tf32=tf32,
            hf_folder=hf_folder, openvino=not no_openvino,
        )  # fmt: skip
        if static_form is not None:
            options.static_form = static_form
        chosen = _providers(False, providers, provider_specs)
        if chosen is not None:
            options.providers = tuple(chosen)
    except ValueError as exc:
        raise click.UsageError(f"--batch and --seq take comma-separated integers, --shapes BATCHxSEQ: {exc}") from exc
    report, gen = run_benchmark(export_dir, preset, options, json_path, plot_path, progress=sys.stderr.isatty())
    click.echo(report.table())
    if gen is not None:
        click.echo(gen.table())
    for path in (json_path, plot_path):
        if path is not None:
            click.echo(f"wrote {path}")


@cli.command("train-demo")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("demo-checkpoint/demo-sort.safetensors"),
    show_default=True,
    help="Checkpoint to write (config.json goes beside it).",
)
@click.option("--steps", default=2500, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--threads", default=2, show_default=True, help="torch CPU threads.")
@_needs("export")
def train_demo(output: Path, steps: int, seed: int, threads: int) -> None:
    """Train the demo digit-sorting model from scratch (seeded; a few minutes on two cores)."""
    import torch

    from edgeattn.demo import train_demo as train
    from edgeattn.weights import save_weights

    torch.set_num_threads(threads)
    result = train(steps=steps, seed=seed, progress=sys.stderr.isatty())
    save_weights(result.model, output)
    click.echo(
        f"trained {result.steps} steps in {result.seconds:.0f} s, final loss {result.final_loss:.2e}, "
        f"held-out exact match {result.accuracy:.2%}; wrote {output}"
    )


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="edgeattn")


if __name__ == "__main__":
    main()
