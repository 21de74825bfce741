"""The Flax models the doctor tests save and restore into (``tests/e2e/test_doctor_matrix.py``,
``test_doctor_like.py``): linen MLPs (renamed, widened, with a second head, a transposed
kernel or fused heads), stacked (``nn.scan``) and unrolled layers, another model altogether,
and nnx modules; with the one batch, loss and optimizer they train on. Each test's target module
(written where ``ckpt doctor --target MODULE:NAME`` imports it) imports these."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

IN, OUT, H = 16, 10, 64


class TDense(nn.Module):
    """A layer storing its kernel as [out, in] (as PyTorch's Linear does)."""

    features: int

    @nn.compact
    def __call__(self, x: Any) -> Any:
        k = self.param("kernel", nn.initializers.lecun_normal(), (self.features, x.shape[-1]))
        return x @ k.T + self.param("bias", nn.initializers.zeros, (self.features,))


class MLP(nn.Module):
    hidden: int = H
    names: tuple[str, str] = ("Dense_0", "Dense_1")
    aux: bool = False  # a second head
    kind: str = "dense"  # "transposed": [out, in] kernel; "heads": [in, 4, H/4] kernel

    @nn.compact
    def __call__(self, x: Any) -> Any:
        if self.kind == "transposed":
            h = TDense(self.hidden, name=self.names[0])(x)
        elif self.kind == "heads":
            h = nn.DenseGeneral((4, self.hidden // 4), name=self.names[0])(x)
            h = h.reshape((*x.shape[:-1], self.hidden))
        else:
            h = nn.Dense(self.hidden, name=self.names[0])(x)
        h = nn.relu(h)
        out = nn.Dense(OUT, name=self.names[1])(h)
        return out + nn.Dense(OUT, name="aux")(h) if self.aux else out


class Block(nn.Module):
    @nn.compact
    def __call__(self, x: Any, _: Any) -> tuple[Any, None]:
        return nn.relu(nn.Dense(H)(x)), None


class Deep(nn.Module):
    """Three layers, stacked by ``nn.scan`` (``layers``) or unrolled (``layers_0``...)."""

    scan: bool = False

    @nn.compact
    def __call__(self, x: Any) -> Any:
        x = nn.Dense(H, name="embed")(x)
        if self.scan:
            layers = nn.scan(
                Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3
            )
            x, _ = layers(name="layers")(x, None)
        else:
            for i in range(3):
                x, _ = Block(name=f"layers_{i}")(x, None)
        return nn.Dense(OUT, name="head")(x)


class Other(nn.Module):
    """Another model altogether: a token embedding and an output layer."""

    @nn.compact
    def __call__(self, x: Any) -> Any:
        e = nn.Embed(100, 32, name="embed")(jnp.zeros(x.shape[:-1], jnp.int32))
        return nn.Dense(OUT, name="out")(e)


class NnxMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.Dense_0 = nnx.Linear(IN, H, rngs=rngs)
        self.Dense_1 = nnx.Linear(H, OUT, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.Dense_1(nnx.relu(self.Dense_0(x)))


class Net(nnx.Module):
    """An nnx MLP whose layers' names and width are chosen (renamed, widened)."""

    def __init__(
        self, rngs: nnx.Rngs, hidden: int = H, names: tuple[str, str] = ("Dense_0", "Dense_1")
    ) -> None:
        self.names = names
        setattr(self, names[0], nnx.Linear(IN, hidden, rngs=rngs))
        setattr(self, names[1], nnx.Linear(hidden, OUT, rngs=rngs))

    def __call__(self, x: Any) -> Any:
        first, second = (getattr(self, n) for n in self.names)
        return second(nnx.relu(first(x)))


def adam() -> optax.GradientTransformation:
    return optax.adam(1e-3)


def batch(width: int = IN) -> tuple[Any, Any]:
    """The one batch every model trains on: inputs of ``width`` features, integer labels."""
    x = jax.random.normal(jax.random.key(1), (32, width))
    return x, jnp.arange(32) % OUT


def xent(logits: Any) -> Any:
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch()[1]).mean()
