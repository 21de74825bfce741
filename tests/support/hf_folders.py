"""Hugging Face model folders written by the ``safetensors`` library itself (not by ckpt), the
index written the way transformers' ``save_pretrained`` writes it, and the damage tests plant
in them: bytes changed in place at a tensor's offsets, headers written by hand."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

INDEX = "model.safetensors.index.json"


def llama_like(seed: int = 0) -> dict[str, Any]:
    """A small Llama-named state dict: float32, float16 and bfloat16 tensors."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    return {
        "model.embed_tokens.weight": rng.standard_normal((32, 16)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((16, 16)).astype(np.float16),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((24, 16)).astype(
            ml_dtypes.bfloat16
        ),
        "model.norm.weight": np.ones(16, np.float32),
        "lm_head.weight": rng.standard_normal((32, 16)).astype(np.float32),
    }


def save_hf_folder(
    folder: Path,
    tensors: Mapping[str, Any],
    shards: int = 2,
    config: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """``tensors`` in ``shards`` files named as transformers names them, each written by
    ``safetensors.numpy.save_file`` with ``{"format": "pt"}`` metadata, the index (when more
    than one shard) as ``{"metadata": {"total_size": N}, "weight_map": ...}``, and a
    config.json. Returns the weight map."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    assert names, "a folder needs tensors"
    groups = [names[i::shards] for i in range(shards)]
    weight_map: dict[str, str] = {}
    for n, group in enumerate(groups, 1):
        file = "model.safetensors" if shards == 1 else f"model-{n:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in group}, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, file))
    if shards > 1:
        total = sum(int(np.asarray(tensors[k]).nbytes) for k in names)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    doc = (
        config
        if config is not None
        else {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    )
    (folder / "config.json").write_text(json.dumps(doc))
    return weight_map


def header_of(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and where its byte buffer starts."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), 8 + n


def perturb(path: Path, tensor: str, delta: float = 1e-3, element: int = 0) -> None:
    """Add ``delta`` to one element of ``tensor``, in place: the header stays as it was."""
    from safetensors.numpy import load_file

    header, start = header_of(path)
    begin, _ = header[tensor]["data_offsets"]
    values = load_file(str(path))[tensor].reshape(-1).copy()
    values[element] = values[element] + np.asarray(delta).astype(values.dtype)
    item = values.dtype.itemsize
    with open(path, "r+b") as f:
        f.seek(start + begin + element * item)
        f.write(values[element : element + 1].tobytes())


def write_raw(path: Path, header: Any, data: bytes = b"", length: int | None = None) -> None:
    """A file with a hand-written header (a dict, or raw bytes) and data; ``length``: the
    8-byte header length to claim instead of the true one."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    n = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + raw + data)
