"""Checkpoint -> Hugging Face directory, without building an engine or an optimizer."""

from __future__ import annotations

import os

import jax
import numpy as np

from lazytrain_jax.train import checkpoint as ckpt


def _model_config(meta: dict):
    from lazytrain_jax.model.config import ModelConfig

    d = dict(meta["compat"]["model"])
    d["layer_kinds"] = tuple(d.get("layer_kinds", ()))
    return ModelConfig(**d)


def read_params(path: str):
    """(ModelConfig, fp32 master params) stored in checkpoint ``path``."""
    from lazytrain_jax.model.units import get_units

    meta = ckpt.read_meta(path)
    cfg = _model_config(meta)
    units = get_units(cfg)
    template = {"params": {"embed": units.abstract_params("embed"),
                           "layers": [units.abstract_params(k) for k in cfg.layer_kinds],
                           "head": units.abstract_params("head")}}
    leaves = {leaf["path"]: leaf for leaf in meta["leaves"]}
    buf = np.memmap(os.path.join(path, "arrays.bin"), dtype=np.uint8, mode="r")
    out = []
    for key_path, ref in jax.tree_util.tree_flatten_with_path(template)[0]:
        name = jax.tree_util.keystr(key_path)
        info = leaves.get(name)
        if info is None or info["shape"] != list(ref.shape):
            raise ckpt.CheckpointError(f"{path}: {name} is missing or has another shape than model config's")
        raw = np.asarray(buf[info["offset"]:info["offset"] + info["nbytes"]])
        out.append(raw.view(np.dtype(info["dtype"])).reshape(info["shape"]).copy())
    tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), out)
    return cfg, tree["params"]


def export_checkpoint(checkpoint: str, out_dir: str, *, tokenizer: str | None = None) -> str:
    """Writes the weights of a checkpoint (or the latest in a checkpoint_dir) as a Hugging Face directory.

    Example:
      >>> export_checkpoint("ckpt", "hf_out", tokenizer="tokenizer_dir")
    """
    from lazytrain_jax.model.container import Model
    from lazytrain_jax.model.hf_io import save_hf

    if not os.path.isdir(checkpoint):
        raise ValueError(f"checkpoint {checkpoint!r} is not a directory")
    path = checkpoint
    if not os.path.isfile(os.path.join(checkpoint, "meta.json")):
        found = ckpt.list_checkpoints(checkpoint)
        if not found:
            raise ValueError(f"{checkpoint!r} holds no checkpoint (step_XXXXXXXX/meta.json)")
        path = found[-1][1]
    cfg, params = read_params(path)
    save_hf(Model(cfg, params), out_dir)
    if tokenizer:
        from lazytrain_jax.data.tokenizer import load_tokenizer
        load_tokenizer(tokenizer).save_pretrained(out_dir)
    return out_dir
