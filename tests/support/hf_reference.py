"""Forward passes written the PyTorch way, in numpy, over state dicts with PyTorch names.

They check export specs by behaviour: weights exported from a Flax model must compute the same
function when used as PyTorch's ``nn.Linear`` uses them (``x @ weight.T + bias``, weight
``[out, in]``) under Hugging Face's names. Written from transformers' modeling code conventions
(LlamaRMSNorm, rotate_half rotary embeddings, SwiGLU MLP), not from the Flax models they check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def linear(x: Any, weight: Any, bias: Any | None = None) -> Any:
    y = x @ np.asarray(weight, np.float32).T
    return y if bias is None else y + np.asarray(bias, np.float32)


def mlp_forward(sd: Mapping[str, Any], x: Any) -> Any:
    """The PyTorch MLP of examples/mlp_to_pytorch.yaml: layers.0 -> relu -> layers.1."""
    h = np.maximum(linear(x, sd["layers.0.weight"], sd["layers.0.bias"]), 0)
    return linear(h, sd["layers.1.weight"], sd["layers.1.bias"])


def _rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    x = x.astype(np.float32)
    return np.asarray(weight, np.float32) * (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps))


def _rotate_half(x: Any) -> Any:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], -1)


def llama_forward(sd: Mapping[str, Any], tokens: Any, heads: int, theta: float = 10000.0) -> Any:
    """Logits of transformers' LlamaForCausalLM (no cache, no GQA) from its state dict."""
    layers = sorted({int(k.split(".")[2]) for k in sd if k.startswith("model.layers.")})
    assert layers == list(range(len(layers))) and layers
    h = np.asarray(sd["model.embed_tokens.weight"], np.float32)[tokens]
    b, t, d = h.shape
    dh = d // heads
    inv_freq = 1.0 / (theta ** (np.arange(0, dh, 2, dtype=np.float32) / dh))
    freqs = np.outer(np.arange(t, dtype=np.float32), inv_freq)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb)[None, :, None, :], np.sin(emb)[None, :, None, :]
    mask = np.tril(np.ones((t, t), bool))
    for i in layers:
        p = f"model.layers.{i}."
        x = _rms_norm(h, sd[p + "input_layernorm.weight"])
        q, k, v = (
            linear(x, sd[p + f"self_attn.{n}_proj.weight"]).reshape(b, t, heads, dh) for n in "qkv"
        )
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        att = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
        att = np.where(mask, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        out = np.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, d)
        h = h + linear(out, sd[p + "self_attn.o_proj.weight"])
        x = _rms_norm(h, sd[p + "post_attention_layernorm.weight"])
        gate = linear(x, sd[p + "mlp.gate_proj.weight"])
        up = linear(x, sd[p + "mlp.up_proj.weight"])
        h = h + linear(gate / (1 + np.exp(-gate)) * up, sd[p + "mlp.down_proj.weight"])
    return linear(_rms_norm(h, sd["model.norm.weight"]), sd["lm_head.weight"])
