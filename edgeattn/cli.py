"""The ``edgeattn`` command line.

The top floor: it imports the rest, nothing imports it. torch is imported only inside the
commands that need it, so ``edgeattn --help`` stays fast and torch-free.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from edgeattn import __version__
from edgeattn.errors import EdgeattnError

log = logging.getLogger("edgeattn")

DEFAULT_OUTPUT = "edgeattn-export"


class _Group(click.Group):
    """Turns library errors into one line on stderr and exit 1 (traceback with --verbose)."""

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


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v for v in value.split(",") if v.strip()]


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
    "--graphs", default=None, help="Comma-separated graphs: attention,encoder,decoder (default: all the model has)."
)
@click.option(
    "--opset", default=17, show_default=True, type=int, help="ONNX opset (above 20 uses the dynamo exporter)."
)
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed of the random weights when no checkpoint is given."
)
@click.option("--no-verify", is_flag=True, help="Skip the parity check against eager PyTorch.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def export(
    output: Path,
    preset: str | None,
    config_file: Path | None,
    checkpoint: Path | None,
    graphs: str | None,
    opset: int,
    seed: int,
    no_verify: bool,
    force: bool,
) -> None:
    """Export the model's attention, encoder and decoder graphs to ONNX, verified."""
    from edgeattn.config import ModelConfig, get_preset
    from edgeattn.exporters.package import export_model
    from edgeattn.model import build_model
    from edgeattn.weights import load_model, read_config

    if preset and config_file:
        raise click.UsageError("give --preset or --config, not both")
    config = ModelConfig.load(config_file) if config_file else (get_preset(preset) if preset else None)
    if checkpoint is not None:
        if preset:
            raise click.UsageError("--checkpoint carries its own config; use --config to override it, not --preset")
        config = config or read_config(checkpoint)
        model = load_model(checkpoint, config)
        source = f"checkpoint {checkpoint.name}"
    else:
        config = config or get_preset("demo")
        model = build_model(config, seed=seed)
        source = f"random weights (seed {seed})"
    # An earlier export in the output directory may be replaced without --force.
    replace = force or (output / "manifest.json").is_file()
    result = export_model(
        model,
        output,
        graphs=_split(graphs),
        opset=opset,
        verify=not no_verify,
        force=replace,
        progress=sys.stderr.isatty(),
        source=source,
    )
    if result.report is not None:
        click.echo(result.report.table())
    click.echo(f"exported {', '.join(result.graphs)} to {result.out_dir} in {result.seconds:.1f} s")


@cli.command()
@click.argument("export_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def verify(export_dir: Path, as_json: bool) -> None:
    """Compare an export with eager PyTorch on fresh shapes; exit 1 on any mismatch."""
    from edgeattn.exporters.verify import verify_export

    report = verify_export(export_dir, progress=sys.stderr.isatty())
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.table())
    if not report.passed:
        click.echo("edgeattn: error: verification failed", err=True)
        sys.exit(1)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def inspect(path: Path, as_json: bool) -> None:
    """Describe an ONNX file (any) or an edgeattn export directory."""
    from edgeattn.exporters.inspect_onnx import format_report, inspect_path, to_json

    info = inspect_path(path)
    click.echo(to_json(info) if as_json else format_report(info))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="edgeattn")


if __name__ == "__main__":
    main()
