"""The Llama example specs on a real Flax model: export to Hugging Face names, import back.

The tree is built with Flax (examples/llama_tree.py: scanned layers) and saved by Orbax. The
export is checked against numpy (every tensor is the Flax leaf unstacked and transposed) and by
behaviour: a PyTorch-convention forward pass over the exported state dict gives the Flax model's
logits. The import restores, through Orbax, into the model's own abstract state, bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.spec.language import load_spec
from tests.support.exchange import export, import_, load_dir
from tests.support.hf_reference import llama_forward
from tests.support.orbax_truth import restore_leaves, same_bytes
from tests.support.paths import REPO

pytestmark = pytest.mark.slow
sys.path.insert(0, str(REPO / "examples"))


def saved_llama(root: Path) -> tuple[Any, Any]:
    import jax
    import llama_tree
    import orbax.checkpoint as ocp

    params = llama_tree.init_params(seed=3)
    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(0, args=ocp.args.StandardSave({"params": params}))
        mgr.wait_until_finished()
    return llama_tree, jax.tree.map(np.asarray, params)


def hf_names(layers: int) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(layers):
        p = f"model.layers.{i}."
        names |= {p + f"self_attn.{n}_proj.weight" for n in "qkvo"}
        names |= {p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
    return names


def test_llama_exports_to_hugging_face_names_and_computes_the_same_logits(tmp_path: Path) -> None:
    import jax.numpy as jnp

    lt, params = saved_llama(tmp_path / "run")
    export(tmp_path / "run", tmp_path / "hf", spec=load_spec(str(REPO / "examples" / "llama_to_hf.yaml")))  # fmt: skip
    sd, metadata = load_dir(tmp_path / "hf")
    assert set(sd) == hf_names(lt.LAYERS)
    assert metadata is not None and metadata["format"] == "pt"
    # numpy: each tensor is its Flax leaf, unstacked and transposed to [out, in].
    for i in range(lt.LAYERS):
        for n in "qkvo":
            want = np.ascontiguousarray(params["layers"][n]["kernel"][i].T)
            assert same_bytes(sd[f"model.layers.{i}.self_attn.{n}_proj.weight"], want)
        assert same_bytes(sd[f"model.layers.{i}.mlp.down_proj.weight"], np.ascontiguousarray(params["layers"]["down"]["kernel"][i].T))  # fmt: skip
        assert same_bytes(sd[f"model.layers.{i}.input_layernorm.weight"], params["layers"]["attn_norm"]["scale"][i])  # fmt: skip
    assert same_bytes(sd["lm_head.weight"], np.ascontiguousarray(params["lm_head"]["kernel"].T))
    assert same_bytes(sd["model.embed_tokens.weight"], params["embed"]["embedding"])
    # Behaviour: Hugging Face's forward pass over the state dict gives the Flax logits.
    tokens = np.random.default_rng(0).integers(0, lt.VOCAB, (2, 8))
    want = np.asarray(lt.LlamaLike().apply({"params": params}, jnp.asarray(tokens)))
    np.testing.assert_allclose(llama_forward(sd, tokens, lt.HEADS), want, rtol=2e-4, atol=2e-4)


def test_hugging_face_llama_imports_into_the_scanned_flax_tree(tmp_path: Path) -> None:
    import orbax.checkpoint as ocp

    lt, params = saved_llama(tmp_path / "run")
    export(tmp_path / "run", tmp_path / "hf", spec=load_spec(str(REPO / "examples" / "llama_to_hf.yaml")), max_shard_size=20000)  # fmt: skip
    result = import_(tmp_path / "hf", tmp_path / "back", spec=load_spec(str(REPO / "examples" / "hf_to_llama.yaml")))  # fmt: skip
    truth = restore_leaves(tmp_path / "run" / "0" / "default")
    got = restore_leaves(Path(result.path) / "default")
    assert got and sorted(got) == sorted(truth)
    assert all(same_bytes(got[k], truth[k]) for k in truth)
    # The model's own abstract state restores it.
    with ocp.CheckpointManager(str(tmp_path / "back")) as mgr:
        state = mgr.restore(0, args=ocp.args.StandardRestore(lt.abstract_state()))
    q = np.asarray(state["params"]["layers"]["q"]["kernel"])
    assert q.shape == (lt.LAYERS, lt.DIM, lt.DIM)
    assert q.tobytes() == params["layers"]["q"]["kernel"].tobytes()


def numpy_hf_state(params: Any, layers: int) -> dict[str, Any]:
    """The Hugging Face Llama state dict made by numpy alone: scanned leaves unstacked, Dense
    kernels transposed to nn.Linear's [out, in]."""
    t = np.ascontiguousarray
    sd = {
        "model.embed_tokens.weight": params["embed"]["embedding"],
        "model.norm.weight": params["final_norm"]["scale"],
        "lm_head.weight": t(params["lm_head"]["kernel"].T),
    }
    stack = params["layers"]
    for i in range(layers):
        p = f"model.layers.{i}."
        sd |= {p + f"self_attn.{n}_proj.weight": t(stack[n]["kernel"][i].T) for n in "qkvo"}
        sd |= {p + f"mlp.{n}_proj.weight": t(stack[n]["kernel"][i].T) for n in ("gate", "up", "down")}  # fmt: skip
        sd[p + "input_layernorm.weight"] = stack["attn_norm"]["scale"][i]
        sd[p + "post_attention_layernorm.weight"] = stack["mlp_norm"]["scale"][i]
    return sd


def test_diff_proves_a_llama_run_and_a_hugging_face_folder_hold_the_same_weights(
    cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    import json

    from safetensors.numpy import save_file

    lt, params = saved_llama(tmp_path / "run")
    spec = REPO / "examples" / "llama_to_hf.yaml"
    sd = numpy_hf_state(params, lt.LAYERS)
    assert set(sd) == hf_names(lt.LAYERS)
    # A folder as transformers' save_pretrained lays it out, written by the safetensors library.
    hf = tmp_path / "hf"
    hf.mkdir()
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
    for file, part in shards.items():
        save_file({n: sd[n] for n in part}, str(hf / file), metadata={"format": "pt"})
    weight_map = {n: f for f, part in shards.items() for n in part}
    (hf / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))  # fmt: skip
    r = cli("diff", tmp_path / "run", hf, "--spec", spec, "--json")
    assert r.code == 0, r.stdout + r.stderr
    assert {x["name"] for x in r.json()["leaves"]} == set(sd)
    # ckpt's own export compares equal too, and a value moved by 1e-3 is named.
    assert cli("export", tmp_path / "run", tmp_path / "exported", "--spec", spec).code == 0
    assert cli("diff", tmp_path / "run", tmp_path / "exported", "--spec", spec).code == 0
    name = "model.layers.1.mlp.down_proj.weight"
    w = sd[name].copy()
    w[2, 3] += np.float32(1e-3)
    save_file({n: (w if n == name else sd[n]) for n in shards["model-00001-of-00002.safetensors"]}, str(hf / "model-00001-of-00002.safetensors"))  # fmt: skip
    assert name in shards["model-00001-of-00002.safetensors"]
    r = cli("diff", tmp_path / "run", hf, "--spec", spec, "--json")
    assert r.code == 1
    bad = [x for x in r.json()["leaves"] if x["status"] != "equal"]
    assert [x["name"] for x in bad] == [name] and bad[0]["mismatched"] == 1
    assert bad[0]["max_abs_diff"] == float(np.abs(w.astype(np.float64) - sd[name].astype(np.float64)).max())  # fmt: skip
    # Without the spec no name matches: every tensor is on one side only.
    doc = cli("diff", tmp_path / "run", hf, "--json").json()
    assert doc["summary"]["only_b"] == len(sd) and doc["summary"]["equal"] == 0
