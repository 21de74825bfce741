"""A small Llama-shaped Flax (Linen) model with scanned layers: the tree `examples/llama_to_hf.yaml`
maps to Hugging Face Llama names, and `examples/hf_to_llama.yaml` maps back.

The layers are one `nn.scan` (as MaxText and most large JAX models do), so every per-layer
parameter carries a leading layer axis: ``params.layers.attn.q.kernel`` is ``[L, D, D]``. Dense
kernels are ``[in, out]`` (PyTorch's ``nn.Linear.weight`` is ``[out, in]``); norms are RMSNorm
``scale``; rotary embeddings rotate halves (Hugging Face's ``rotate_half``), so q/k need no
permutation on the way to Hugging Face.

    python examples/llama_tree.py --workdir demo_runs/llama     # saves step 0 with Orbax
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

VOCAB, DIM, HIDDEN, LAYERS, HEADS = 64, 32, 48, 2, 4


def rotary(x: jax.Array) -> jax.Array:
    """Rotary embedding on [..., T, H, Dh], halves rotated (Hugging Face's layout)."""
    t, dh = x.shape[-3], x.shape[-1]
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, dh, 2) / dh))
    angles = jnp.arange(t)[:, None] * freqs[None, :]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, -1)[:, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, -1)[:, None, :]
    half = jnp.concatenate([-x[..., dh // 2 :], x[..., : dh // 2]], -1)
    return x * cos + half * sin


class Block(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
        b, t, d = x.shape
        h = nn.RMSNorm(name="attn_norm")(x)
        q, k, v = (
            nn.Dense(d, use_bias=False, name=n)(h).reshape(b, t, HEADS, d // HEADS)
            for n in ("q", "k", "v")
        )
        q, k = rotary(q), rotary(k)
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // HEADS)
        att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), att, -1e9)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, -1), v).reshape(b, t, d)
        x = x + nn.Dense(d, use_bias=False, name="o")(out)
        h = nn.RMSNorm(name="mlp_norm")(x)
        gate = nn.Dense(HIDDEN, use_bias=False, name="gate")(h)
        up = nn.Dense(HIDDEN, use_bias=False, name="up")(h)
        x = x + nn.Dense(d, use_bias=False, name="down")(nn.silu(gate) * up)
        return x, None


class LlamaLike(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, DIM, name="embed")(tokens)
        layers = nn.scan(
            Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=LAYERS
        )
        x, _ = layers(name="layers")(x, None)
        x = nn.RMSNorm(name="final_norm")(x)
        return nn.Dense(VOCAB, use_bias=False, name="lm_head")(x)


def init_params(seed: int = 0) -> Any:
    return LlamaLike().init(jax.random.key(seed), jnp.zeros((1, 8), jnp.int32))["params"]


def abstract_state() -> Any:
    """The shapes and dtypes of ``{"params": ...}``: a ``--target`` for migrate and import."""
    return jax.eval_shape(lambda: {"params": init_params()})


def main() -> None:
    import orbax.checkpoint as ocp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    with ocp.CheckpointManager(os.path.abspath(args.workdir)) as mgr:
        mgr.save(0, args=ocp.args.StandardSave({"params": init_params()}))
        mgr.wait_until_finished()
    print(f"saved step 0 of a {LAYERS}-layer Llama-shaped model to {args.workdir}")


if __name__ == "__main__":
    main()
