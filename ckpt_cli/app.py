"""The ``ckpt`` Typer app: registers every command and is the one error boundary.

Exit codes: 0 ok; 1 a check found problems; 2 usage error; 3 expected failure (not a checkpoint,
unreadable, refused); 70 a bug in ckpt (rerun with CKPT_DEBUG=1); 130 interrupted.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

import typer

from ckpt_cli._version import __version__
from ckpt_cli.commands import diff as diff_cmd
from ckpt_cli.commands import inspect as inspect_cmd
from ckpt_cli.commands import ls as ls_cmd
from ckpt_cli.commands import migrate as migrate_cmd
from ckpt_cli.commands import prune as prune_cmd
from ckpt_cli.commands import reshard as reshard_cmd
from ckpt_cli.commands import verify as verify_cmd
from ckpt_cli.errors import EXIT_BUG, EXIT_INTERRUPTED, CkptError, first_line

HELP = """List, inspect, verify, diff, prune, reshard and migrate Orbax checkpoints; the read commands need no JAX.

Exit codes: 0 ok · 1 a check found problems · 2 usage error · 3 not a checkpoint, unreadable or refused · 70 internal error (rerun with CKPT_DEBUG=1) · 130 interrupted.
"""

app = typer.Typer(
    name="ckpt",
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ckpt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    s3_endpoint: str | None = typer.Option(
        None,
        "--s3-endpoint",
        metavar="URL",
        help="S3-compatible endpoint for s3:// paths (MinIO, Ceph, a local server), e.g. "
        "http://127.0.0.1:9000. Default: $CKPT_S3_ENDPOINT, $AWS_ENDPOINT_URL_S3, "
        "$AWS_ENDPOINT_URL, else AWS.",
        show_default=False,
    ),
    max_requests: int | None = typer.Option(
        None,
        "--max-requests",
        metavar="N",
        min=1,
        help="Requests to an object store kept in flight at once by each process (TensorStore's "
        "reads and writes, listings, batched deletes). Default: $CKPT_MAX_REQUESTS, else 64.",
        show_default=False,
    ),
) -> None:
    """List, inspect, verify, diff, prune, reshard and migrate Orbax checkpoints; the read commands need no JAX."""
    from ckpt_cli.core.storage.options import StorageOptions, apply_request_limit

    # Configuration as data: the commands hand these options to the core, which carries them
    # to every location it opens and every worker it starts.
    ctx.obj = StorageOptions.from_environment(s3_endpoint=s3_endpoint, max_requests=max_requests)
    apply_request_limit(ctx.obj)  # before anything imports TensorStore


app.command("ls")(ls_cmd.ls)
app.command("inspect")(inspect_cmd.inspect)
app.command("verify")(verify_cmd.verify)
app.command("diff")(diff_cmd.diff)
app.command("prune")(prune_cmd.prune)
app.command("reshard")(reshard_cmd.reshard)
app.command("migrate")(migrate_cmd.migrate)


class Interrupted(Exception):
    """Raised from the SIGINT handler so that Click does not turn Ctrl-C into exit 1."""


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    raise Interrupted()


def main() -> None:
    """Run the app; turn every error into one stderr line and a documented exit code."""
    signal.signal(signal.SIGINT, _on_sigint)
    debug = bool(os.environ.get("CKPT_DEBUG"))
    try:
        app()
    except CkptError as e:
        if debug:
            raise
        sys.stderr.write(f"ckpt: error: {e}\n")
        sys.exit(e.exit_code)
    except Interrupted:
        sys.stderr.write("ckpt: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # `ckpt ls | head`: the reader left; exit quietly as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except Exception as e:
        if debug:
            raise
        first = first_line(e) if str(e) else ""
        sys.stderr.write(
            f"ckpt: internal error: {type(e).__name__}: {first} "
            "(this is a bug in ckpt; rerun with CKPT_DEBUG=1 to see the traceback)\n"
        )
        sys.exit(EXIT_BUG)
