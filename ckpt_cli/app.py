"""The ``ckpt`` Typer app: registers every command and is the one error boundary.

Exit codes: 0 ok; 1 a check found problems; 2 usage error; 3 expected failure (not a checkpoint,
unreadable, refused); 70 a bug in ckpt (rerun with CKPT_DEBUG=1); 130 interrupted (Ctrl-C);
143 terminated (SIGTERM).
"""

# ruff: noqa: E402 - the starting signal handler goes in before the slow imports

from __future__ import annotations

from ckpt_cli import signals

signals.while_starting()

import os
import signal
import sys
from collections.abc import Mapping

from ckpt_cli.errors import Interrupted

signals.quiet_hooks()  # before Typer is imported: it keeps the hook it finds

import typer

from ckpt_cli._version import ISSUES, __version__
from ckpt_cli.commands import COMMANDS
from ckpt_cli.commands._help import HelpCommand, HelpGroup
from ckpt_cli.errors import (
    CODE_INTERNAL,
    CODE_INTERRUPTED,
    CODE_USAGE,
    EXIT_BUG,
    CkptError,
    first_line,
    storage_refusal,
)

HELP = """List, inspect, verify, diff, prune, reshard, migrate and copy Orbax checkpoints (local disk, S3, GCS), and export them to safetensors (and import back); the read commands need no JAX.

Exit codes: 0 ok · 1 a check found problems · 2 usage error · 3 not a checkpoint, unreadable or refused · 70 internal error (rerun with CKPT_DEBUG=1) · 130 interrupted (Ctrl-C) · 143 terminated (SIGTERM).
"""

app = typer.Typer(
    name="ckpt",
    cls=HelpGroup,
    help=HELP,
    no_args_is_help=True,
    # bash, zsh and fish: --install-completion / --show-completion; steps and items complete
    # from the root on the line (commands/_complete.py).
    add_completion=True,
    # Markdown: `[null, model]` stays text (Rich markup took it for a style), paragraphs reflow,
    # and the indented `$ ckpt ...` examples keep their lines.
    rich_markup_mode="markdown",
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
        "reads and writes, listings, batched deletes; reads of small metadata files on S3: four "
        "times N, at most 512). Default: $CKPT_MAX_REQUESTS, else 64.",
        show_default=False,
    ),
) -> None:
    """List, inspect, verify, diff, prune, reshard, migrate and copy Orbax checkpoints (local disk, S3, GCS), and export them to safetensors (and import back); the read commands need no JAX."""
    from ckpt_cli.core.storage.options import StorageOptions, apply_request_limit

    # Configuration as data: the commands hand these options to the core, which carries them
    # to every location it opens and every worker it starts.
    ctx.obj = StorageOptions.from_environment(s3_endpoint=s3_endpoint, max_requests=max_requests)
    apply_request_limit(ctx.obj)  # before anything imports TensorStore


for _command in COMMANDS:
    app.command(_command.name, cls=HelpCommand, help=_command.help())(_command.function)


def _json_mode(argv: list[str]) -> bool:
    """``--json`` on the command line (before any ``--``): decided from the raw arguments,
    because a usage error happens before any option is parsed."""
    args = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in args


def _fail(
    json_mode: bool, code: int, line: str, error: Mapping[str, object], result: object
) -> None:
    """One stderr line; with --json also the one error document on stdout; exit ``code``."""
    sys.stderr.write(line + "\n")
    if json_mode:
        from ckpt_cli.commands._output import emit_error
        from ckpt_cli.commands._schemas import schema_version_of_argv

        emit_error(schema_version_of_argv(sys.argv[1:]), error, result)
    sys.exit(code)


def _status(code: object) -> int:
    """The process exit status of ``sys.exit(code)``."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _fail_interrupted(json_mode: bool) -> None:
    """A signal came and the error on its way is what became of the ``Interrupted`` (an
    extension running Python code, its module init or a callback, turns it into an error of
    its own: ``ImportError: initialization failed``): the run was interrupted all the same."""
    signum = signals.stopped_by() or signal.SIGINT
    name = signal.Signals(signum).name
    error = {"code": CODE_INTERRUPTED, "message": f"interrupted by {name}", "hint": None}
    _fail(json_mode, 128 + signum, "ckpt: interrupted", error, None)


def main() -> None:
    """Run the app; turn every error into one stderr line and a documented exit code (with
    --json, also one JSON error document on stdout)."""
    signals.install()
    # ckpt's own threads do its parallel work; numpy's OpenBLAS pool (a thread a CPU, spinning
    # once numpy is imported) only burned CPU: 1.3 s of verify --deep's 14.4 s on 13 cores.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        try:
            _run()
        except SystemExit as e:
            signals.finished(_status(e.code))
            raise
    except Interrupted as late:
        # The signal came after the command had ended (output written, its SystemExit on the
        # way out) and before `finished` took over: the run ends as it would have, with its own
        # code. Raised in the handler above, the interrupt's context is that SystemExit.
        ended = late.__context__
        code = _status(ended.code) if isinstance(ended, SystemExit) else 0
        signals.finished(code)
        sys.exit(code)
    signals.finished(0)


def closest_option(typed: str, names: list[str]) -> list[str]:
    """The option of ``names`` an unknown ``typed`` most likely meant, as a list of one, or
    none: the one option it starts or that starts it (``--steps``/``--step``,
    ``--fil``/``--filter``), else the closest by spelling, dashes aside (``--stpe``). Click's
    own guess also offered hidden options and unrelated ones (``trend --filter`` once suggested
    ``--item``)."""
    import difflib

    bare = {n.lstrip("-"): n for n in names if n.startswith("--")}
    word = typed.lstrip("-")
    if len(word) >= 3:
        prefixed = [
            n for b, n in bare.items() if (len(b) >= 3 and word.startswith(b)) or b.startswith(word)
        ]
        if len(prefixed) == 1:
            return prefixed
    close = difflib.get_close_matches(word, list(bare), n=1, cutoff=0.75)
    return [bare[close[0]]] if close else []


def _own_suggestion(e: typer.TyperException) -> None:
    """An unknown option's suggestion, from the command's own visible options only
    (``closest_option``)."""
    typed, ctx = getattr(e, "option_name", None), getattr(e, "ctx", None)
    if not isinstance(typed, str) or ctx is None or not hasattr(e, "possibilities"):
        return
    names = [
        name
        for param in ctx.command.get_params(ctx)
        if not getattr(param, "hidden", False)
        for name in (*param.opts, *param.secondary_opts)
    ]
    setattr(e, "possibilities", closest_option(typed, names))  # noqa: B010 - not a TyperException field


def _usage_error(e: typer.TyperException, json_mode: bool) -> None:
    """A command line Click could not parse: one line on stderr naming the help to read (with
    --json also the error document), exit 2."""
    _own_suggestion(e)
    message = (e.format_message().strip().splitlines() or [type(e).__name__])[0]
    error = {"code": CODE_USAGE, "message": message, "hint": "see `ckpt COMMAND --help`"}
    line = f"ckpt: error: {message}"
    ctx = getattr(e, "ctx", None)  # the command whose line failed to parse
    if not json_mode:
        line += f" (see `{getattr(ctx, 'command_path', None) or 'ckpt'} --help`)"
    _fail(json_mode, e.exit_code, line, error, None)


def _run() -> None:
    debug = bool(os.environ.get("CKPT_DEBUG"))
    json_mode = _json_mode(sys.argv[1:])
    try:
        if not sys.argv[1:]:
            app()  # no arguments: the help, as Typer shows it (no_args_is_help), exit 2
        # Click's usage errors reach this boundary as exceptions: one line, not a panel.
        sys.exit(app(standalone_mode=False) or 0)
    except CkptError as e:
        if signals.stopped_by() is not None and not debug:
            _fail_interrupted(json_mode)
        if debug:
            raise
        _fail(json_mode, e.exit_code, f"ckpt: error: {e}", e.to_json(), e.result)
    except Interrupted as e:
        # With --json too: the one document says only that the run was stopped (and by
        # which signal), never a verdict on the work it did not finish.
        error = {"code": CODE_INTERRUPTED, "message": f"interrupted by {e}", "hint": None}
        _fail(json_mode, e.exit_code, "ckpt: interrupted", error, None)
    except BrokenPipeError:
        # `ckpt ls | head`: the reader left; exit quietly (with 1 in text mode, as Typer's own
        # handler of a closed pipe did before this boundary took it over).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0 if json_mode else 1)
    except typer.TyperException as e:  # Click's usage errors
        _usage_error(e, json_mode)
    except Exception as e:
        if signals.stopped_by() is not None and not debug:
            _fail_interrupted(json_mode)
        if debug:
            raise
        refusal = storage_refusal(e)
        if refusal is not None:
            _fail(json_mode, refusal.exit_code, f"ckpt: error: {refusal}", refusal.to_json(), None)
        first = first_line(e) if str(e) else ""
        hint = (
            "this is a bug in ckpt; rerun with CKPT_DEBUG=1 to see the traceback,"
            f" and report it at {ISSUES}"
        )
        error = {"code": CODE_INTERNAL, "message": f"{type(e).__name__}: {first}", "hint": hint}
        _fail(
            json_mode,
            EXIT_BUG,
            f"ckpt: internal error: {type(e).__name__}: {first} ({hint})",
            error,
            None,
        )
