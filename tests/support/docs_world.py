"""The world the docs' command lines assume, made real in a fresh directory.

A page writes ``ckpt diff runs/exp7@900 runs/exp7@1000`` or ``ckpt cp runs/exp7
s3://bucket/exp7``: a reader has a run called ``runs/exp7`` and a bucket. :data:`THINGS` is the
one table of those placeholders: each path a page or a ``--help`` example names, what it stands
for, and how it is made from the committed fixtures, the bundled examples or a ``ckpt`` command
in the group's directory. :data:`NEEDS` says which of them each group of commands (a page, or
the examples of one command's ``--help``) starts with; what the group's own commands write is
not in it. The paths stay as the docs write them; only a bucket URL and an endpoint are rewritten
(:data:`SUBSTITUTIONS`), because the test servers hold one bucket and listen on their own ports.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.docs_examples import REPO, Command, prepare_workdir, run_command
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET

#: The run most pages and examples call ``runs/exp7``: the MLP the demo trains
#: (``examples/train_mlp.py``, fixture ``seed_mlp``: steps 300 400 500), its steps copied to the
#: step numbers the docs use. Copies of one step hold equal values; 900 and 1000 differ.
EXP7_STEPS = {100: 300, 200: 300, 300: 300, 400: 400, 500: 500, 600: 500, 900: 400, 1000: 500}
#: ``demo_runs/exp7`` after ``make demo``: three steps, 400 500 600 (keep 3 of every 100).
DEMO_STEPS = {400: 300, 500: 400, 600: 500}

_MODEL_MLP = '''"""The reader's model module: the demo's MLP (examples/train_mlp.py, hidden 64), its
kernels sharded over the 8 devices of a ``data`` mesh as a trainer would place them."""
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from examples.train_mlp import abstract_state as _abstract


def abstract_state():
    mesh = Mesh(jax.devices()[:8], ("data",))

    def place(path, x):
        spec = P("data", None) if jax.tree_util.keystr(path).endswith("['kernel']") else P()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(place, _abstract(64))


def abstract():
    """The same state with bfloat16 parameters (what cast.yaml makes)."""
    cast = lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16)  # noqa: E731
    state = _abstract(64)
    return {**state, "params": jax.tree.map(cast, state["params"])}
'''

_MODEL_LLAMA = '''"""The reader's model module: the Llama-shaped model of examples/llama_tree.py."""
from examples.llama_tree import abstract_state as abstract  # noqa: F401
'''

_CAST_SPEC = """version: 1
rules:
  - {op: cast, match: 'params\\..*', dtype: bfloat16}
"""


@dataclass(frozen=True)
class Ctx:
    """Where a group runs: its directory and the unique prefix its bucket paths get. With
    ``capsys``, a plain ``ckpt ...`` line runs in this process (:func:`run_line`)."""

    workdir: Path
    prefix: str
    capsys: pytest.CaptureFixture[str] | None = None

    def sh(self, text: str) -> None:
        """Run a command line as a page would (``ckpt`` is this checkout's), substituted."""
        command = Command(REPO / "tests" / "support" / "docs_world.py", 0, text, 0, ())
        code, stderr = run_line(command, self)
        assert code == 0, f"making the world: `{text}`\n{stderr[-2000:]}"


#: What only a shell can run: pipes, redirections, ``&&``, variables, ``NAME=value`` before it.
_SHELL = re.compile(r"[|&;<>$`\\]|^\w+=")


def ckpt_words(text: str) -> list[str] | None:
    """The arguments of a plain ``ckpt ...`` line (its comment dropped); ``None`` when the line
    needs a shell or is not ``ckpt``'s."""
    if _SHELL.search(text.split("#", 1)[0]):
        return None
    words = shlex.split(text, comments=True)
    return words[1:] if words and words[0] == "ckpt" else None


def run_line(command: Command, ctx: Ctx) -> tuple[int, str]:
    """Run one line in the group's directory: (exit code, stderr). A plain ``ckpt ...`` line goes
    through ``main()`` in this process when ``ctx`` has ``capsys`` (what the CLI tests do: no
    interpreter start and no imports per line), anything else through bash."""
    command = substituted(command, ctx)
    words = ckpt_words(command.text)
    if words is None or ctx.capsys is None:
        result = run_command(command, ctx.workdir)
        return result.returncode, result.stderr
    old = os.getcwd()
    os.chdir(ctx.workdir)
    try:
        ran = run_cli(words, ctx.capsys)
    finally:
        os.chdir(old)
    return ran.code, ran.stderr


def forget_imports(workdir: Path) -> None:
    """Drop what a ``--target`` imported from ``workdir`` (``model``, ``examples``): the next
    group's ``model.py`` is another one."""
    sys.path[:] = [p for p in sys.path if p != str(workdir)]
    for name in [m for m in sys.modules if m in ("model", "examples") or m.startswith("examples.")]:
        del sys.modules[name]


@dataclass(frozen=True)
class Thing:
    path: str  # as the docs write it; ``runs/exp7 (sharded_4x2)`` is what one page means by it
    means: str  # what it stands for
    make: Callable[[Ctx], None]


def _steps(dst: str, steps: dict[int, int], metrics: bool = False) -> Callable[[Ctx], None]:
    def make(ctx: Ctx) -> None:
        root = ctx.workdir / dst
        root.mkdir(parents=True)
        for step, source in steps.items():
            shutil.copytree(FIXTURES / "seed_mlp" / str(source), root / str(step))
            if metrics:  # what CheckpointManager.save(step, metrics={...}) records
                meta_file = root / str(step) / "_CHECKPOINT_METADATA"
                meta = json.loads(meta_file.read_text())
                meta["metrics"] = {"loss": round(2.0 / (1 + step / 100), 4)}
                meta_file.write_text(json.dumps(meta))

    return make


def _copy(src: Path | str, dst: str) -> Callable[[Ctx], None]:
    def make(ctx: Ctx) -> None:
        source = src if isinstance(src, Path) else ctx.workdir / src
        target = ctx.workdir / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copyfile(source, target)

    return make


def _write(dst: str, text: str) -> Callable[[Ctx], None]:
    def make(ctx: Ctx) -> None:
        (ctx.workdir / dst).write_text(text)

    return make


def _sh(*lines: str) -> Callable[[Ctx], None]:
    def make(ctx: Ctx) -> None:
        for line in lines:
            ctx.sh(line)

    return make


def _saves(ctx: Ctx) -> None:
    for name in ("state", "other"):
        shutil.copytree(FIXTURES / "single_checkpointer", ctx.workdir / "ckpt_dir" / name)


_MESH = REPO / "examples" / "mesh_4x2.yaml"
_RESHARD = "ckpt reshard runs/exp7 {} --mesh data=4,model=2 --rules examples/mesh_4x2.yaml"
_RESHARD_2X4 = (
    "ckpt reshard runs/exp7 runs/exp7-2x4 --mesh data=2,model=4 --rule 'params.w=[data, model]'"
    " --rule 'params.b=[null, model]' --rule 'params.replicated=[]'"
)

# fmt: off
#: Every placeholder of the docs and the --help examples, and how it is made real.
THINGS: dict[str, Thing] = {
    t.path: t
    for t in (
        Thing("runs/exp7", "the demo's MLP run, steps 100-1000, a loss each", _steps("runs/exp7", EXP7_STEPS, True)),
        Thing("demo_runs/exp7", "the run `make demo` trains: steps 400 500 600", _steps("demo_runs/exp7", DEMO_STEPS)),
        Thing("runs/exp7 (demo)", "examples/train_mlp.py's run as fixtures/ckpts/seed_mlp holds it: steps 300 400 500", _copy(FIXTURES / "seed_mlp", "runs/exp7")),
        Thing("runs/exp7 (sharded_4x2)", "fixtures/ckpts/sharded_4x2: a (4,2) mesh", _copy(FIXTURES / "sharded_4x2", "runs/exp7")),
        Thing("runs/exp7-2x4 (sharded_4x2)", "it resharded for a (2,4) mesh, each spec kept", _sh(_RESHARD_2X4)),
        Thing("runs/nnx", "a Flax NNX model and optimizer, items model and optimizer", _sh("python examples/nnx_model_optimizer.py --workdir runs/nnx")),
        Thing("run", "a run (the scale-out page's)", _steps("run", {500: 500})),
        Thing("runs/exp8", "a second run of the same model", _steps("runs/exp8", {700: 500})),
        Thing("runs/a", "a run", _steps("runs/a", {500: 500})),
        Thing("runs/b", "another run of the same model", _steps("runs/b", {500: 400})),
        Thing("runs/other", "runs/exp7 resharded for a 4x2 mesh", _sh(_RESHARD.format("runs/other"))),
        Thing("runs/exp7-4x2", "runs/exp7 resharded for a 4x2 mesh", _sh(_RESHARD.format("runs/exp7-4x2"))),
        Thing("runs/llama", "the Llama-shaped model of examples/llama_tree.py, step 0", _sh("python examples/llama_tree.py --workdir runs/llama")),
        Thing("hf", "a Llama-shaped model (examples/llama_tree.py) with Hugging Face names", _sh("python examples/llama_tree.py --workdir llama-src", "ckpt export llama-src hf --spec examples/llama_to_hf.yaml", "rm -r llama-src")),
        Thing("hf/llama", "step 1000 of runs/exp7 as Hugging Face safetensors (no spec)", _sh("ckpt export runs/exp7 hf/llama --step 1000")),
        Thing("out", "step 600 of runs/exp7 exported for PyTorch", _sh("ckpt export runs/exp7 out --step 600 --spec examples/mlp_to_pytorch.yaml")),
        Thing("model.safetensors", "the parameters of runs/exp7 as one safetensors file", _sh("ckpt export runs/exp7 st --params-only", "mv st/model.safetensors . && rm -r st")),
        Thing("export", "runs/exp7 exported in 4 KiB shards, with an index", _sh("ckpt export runs/exp7 export --max-shard-size 4KiB")),
        Thing("ckpt_dir", "two saves of a StandardCheckpointer side by side", _saves),
        Thing("model.py", "the reader's model: the demo's MLP", _write("model.py", _MODEL_MLP)),
        Thing("model.py (llama)", "the reader's model: the Llama-shaped one", _write("model.py", _MODEL_LLAMA)),
        Thing("cast.yaml", "a migrate spec casting the parameters to bfloat16", _write("cast.yaml", _CAST_SPEC)),
        Thing("widen.yaml", "examples/widen_64_to_128.yaml", _copy(REPO / "examples" / "widen_64_to_128.yaml", "widen.yaml")),
        Thing("mlp_to_pytorch.yaml", "examples/mlp_to_pytorch.yaml", _copy(REPO / "examples" / "mlp_to_pytorch.yaml", "mlp_to_pytorch.yaml")),
        Thing("pytorch_to_mlp.yaml", "examples/pytorch_to_mlp.yaml", _copy(REPO / "examples" / "pytorch_to_mlp.yaml", "pytorch_to_mlp.yaml")),
        Thing("llama_to_hf.yaml", "examples/llama_to_hf.yaml", _copy(REPO / "examples" / "llama_to_hf.yaml", "llama_to_hf.yaml")),
        Thing("hf_to_llama.yaml", "examples/hf_to_llama.yaml", _copy(REPO / "examples" / "hf_to_llama.yaml", "hf_to_llama.yaml")),
        Thing("r.yaml", "examples/mesh_4x2.yaml", _copy(_MESH, "r.yaml")),
        Thing("rules.yaml", "examples/mesh_4x2.yaml", _copy(_MESH, "rules.yaml")),
        Thing("mesh.yaml", "examples/mesh_4x2.yaml", _copy(_MESH, "mesh.yaml")),
        Thing("mesh_4x2.yaml", "examples/mesh_4x2.yaml", _copy(_MESH, "mesh_4x2.yaml")),
        Thing("s3://bucket/exp7", "runs/exp7 in a bucket", _sh("ckpt cp runs/exp7 s3://bucket/exp7")),
        Thing("s3://bucket/runs/exp7", "runs/exp7 in a bucket", _sh("ckpt cp runs/exp7 s3://bucket/runs/exp7")),
        Thing("s3://ckpts/exp7", "runs/exp7 in a bucket", _sh("ckpt cp runs/exp7 s3://ckpts/exp7")),
        Thing("gs://ckpts/exp7", "runs/exp7 in a GCS bucket", _sh("ckpt cp runs/exp7 gs://ckpts/exp7")),
    )
}
# fmt: on

#: What each group starts with, in the order it is made (a later thing may use an earlier one).
NEEDS: dict[str, tuple[str, ...]] = {
    # The examples of each command's --help (its Command record).
    "ls": ("runs/exp7", "s3://bucket/runs/exp7"),
    "du": ("runs/exp7", "s3://bucket/runs/exp7"),
    "inspect": ("runs/exp7", "export"),
    "verify": ("runs/exp7", "export"),
    "digest": ("runs/exp7", "export"),
    "diff": (
        "runs/exp7", "runs/exp7-4x2", "runs/a", "runs/b", "runs/llama", "hf", "llama_to_hf.yaml",
    ),
    "doctor": ("runs/exp7", "runs/exp8", "hf/llama", "model.py"),
    "trend": ("runs/exp7",),
    "prune": ("runs/exp7",),
    "reshard": ("runs/exp7", "r.yaml", "runs/other"),
    "migrate": ("runs/exp7", "widen.yaml", "cast.yaml", "model.py"),
    "average": ("runs/exp7",),
    "export": ("runs/exp7", "mlp_to_pytorch.yaml", "runs/llama", "llama_to_hf.yaml"),
    "import": (
        "runs/exp7", "out", "pytorch_to_mlp.yaml", "hf", "hf_to_llama.yaml",
        "model.py (llama)", "model.safetensors", "r.yaml",
    ),
    "cp": ("runs/exp7",),
    "pin": ("runs/exp7", "s3://bucket/exp7"),
    "unpin": ("runs/exp7", "s3://bucket/exp7"),
    # The pages.
    "docs/explanation/scale-out.md": ("run", "rules.yaml"),
    "docs/how-to/du.md": (),
    "docs/how-to/average.md": ("runs/exp7",),
    "docs/how-to/diff.md": ("runs/exp7 (sharded_4x2)", "runs/exp7-2x4 (sharded_4x2)"),
    "docs/how-to/doctor.md": ("runs/exp7 (demo)",),
    "docs/how-to/export.md": ("runs/exp7",),
    "docs/how-to/huggingface.md": ("runs/exp7", "export"),
    "docs/how-to/inspecting.md": ("ckpt_dir", "demo_runs/exp7"),
    "docs/how-to/migrate.md": ("runs/exp7 (demo)",),
    "docs/how-to/object-storage.md": (
        "runs/exp7", "mesh.yaml", "ckpt_dir", "s3://ckpts/exp7", "gs://ckpts/exp7",
    ),
    "docs/how-to/reshard.md": ("runs/exp7 (demo)", "runs/nnx"),
    "docs/how-to/retention.md": ("demo_runs/exp7",),
    "docs/how-to/trend.md": ("runs/exp7",),
    "docs/how-to/verify.md": ("runs/exp7", "mesh_4x2.yaml"),
    "docs/reference/layouts.md": ("runs/exp7",),
}  # fmt: skip


def _bucket(ctx: Ctx, scheme: str, name: str) -> str:
    return f"{scheme}://{BUCKET}/{ctx.prefix}/{name}/"


#: What is rewritten in a command line before it runs, and why: (written, run as, why).
SUBSTITUTIONS: tuple[tuple[str, Callable[[Ctx], str], str], ...] = (
    *(
        (f"{scheme}://{name}/", lambda ctx, s=scheme, n=name: _bucket(ctx, s, n), "the test servers hold one bucket")
        for scheme, names in (("s3", ("bucket", "ckpts")), ("gs", ("ckpts", "other")))
        for name in names
    ),
    ("http://127.0.0.1:9000", lambda ctx: _env_endpoint(), "the test S3 server's port"),
    ("http://minio:9000", lambda ctx: _env_endpoint(), "the test S3 server stands for MinIO"),
)  # fmt: skip


def _env_endpoint() -> str:
    import os

    return os.environ["CKPT_S3_ENDPOINT"]


def substituted(command: Command, ctx: Ctx) -> Command:
    text = command.text
    for written, run_as, _ in SUBSTITUTIONS:
        if written in text:
            text = text.replace(written, run_as(ctx))
    return replace(command, text=text)


def make_world(group: str, workdir: Path, capsys: pytest.CaptureFixture[str] | None = None) -> Ctx:
    """``workdir`` as the reader's directory before the group's first command: fixtures/,
    examples/ and what :data:`NEEDS` names for the group."""
    prepare_workdir(workdir)
    ctx = Ctx(workdir, f"docs-{uuid.uuid4().hex[:8]}", capsys)
    for path in NEEDS[group]:
        THINGS[path].make(ctx)
    return ctx


def uses_buckets(group: str, texts: list[str]) -> tuple[bool, bool]:
    """Whether the group needs the S3 server, the GCS one."""
    joined = " ".join([*texts, *NEEDS[group]])
    return "s3://" in joined, "gs://" in joined
