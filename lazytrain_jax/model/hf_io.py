"""Hugging Face checkpoints: load into per-unit host parameters, save loadable by transformers.

Parameter names inside a unit are Hugging Face's; a unit's prefix completes the checkpoint name:
``embed`` -> ``model.``, ``layers[i]`` -> ``model.layers.{i}.``, head ``norm`` -> ``model.norm``,
head ``lm_head`` -> ``lm_head``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Iterator

import jax
import numpy as np

from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.container import Model, numpy_dtype
from lazytrain_jax.model.safetensors_io import CheckpointError, read_header, read_tensors, write_file
from lazytrain_jax.model.units import get_units

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors some checkpoints carry that the model does not use.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _flat(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        elif value is not None:
            yield f"{prefix}{key}", value


def _unit_prefixes(cfg: ModelConfig) -> Iterator[tuple[tuple, str]]:
    """(location in params, name prefix) for every unit."""
    yield ("embed",), "model."
    for i in range(cfg.num_layers):
        yield ("layers", i), f"model.layers.{i}."


def _named_leaves(cfg: ModelConfig, params: dict) -> Iterator[tuple[str, tuple, Any]]:
    """(HF name, location path in params, leaf) for every parameter."""
    for loc, prefix in _unit_prefixes(cfg):
        unit = params[loc[0]] if len(loc) == 1 else params[loc[0]][loc[1]]
        for name, leaf in _flat(unit):
            yield prefix + name, loc + tuple(name.split(".")), leaf
    for name, leaf in _flat(params["head"]):
        hf = "model." + name if name.startswith("norm.") else name
        yield hf, ("head",) + tuple(name.split(".")), leaf


def to_hf_state_dict(config: ModelConfig, params: dict) -> dict[str, np.ndarray]:
    """Maps a params-shaped tree (weights or gradients) to Hugging Face tensor names (numpy arrays).

    Example:
      >>> sd = to_hf_state_dict(model.config, grads)
      >>> sd["model.layers.0.self_attn.q_proj.weight"].shape
    """
    return {name: np.asarray(leaf) for name, _, leaf in _named_leaves(config, params)}


def _abstract_params(cfg: ModelConfig) -> dict:
    units = get_units(cfg)
    return {"embed": units.abstract_params("embed"),
            "layers": [units.abstract_params(k) for k in cfg.layer_kinds],
            "head": units.abstract_params("head")}


def _set(tree, path, value):
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _weight_files(path: str) -> dict[str, list[str]]:
    """file -> tensor names, from the index (sharded) or the single file."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e!r})") from None
        files: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            files.setdefault(os.path.join(path, file), []).append(name)
        return files
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(single):
        return {single: None}
    raise CheckpointError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE} found "
                          f"(files: {sorted(os.listdir(path))[:20]})")


def load_model(path: str | os.PathLike, dtype: str | None = None, strict: bool = True) -> Model:
    """Loads a Hugging Face checkpoint directory (config.json + safetensors, single or sharded).

    Tensors are read one at a time straight into per-unit host arrays; no second copy of the model
    is held. Every name and shape is validated before anything is read.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` or ``model.safetensors.index.json``.
      dtype: host master dtype (default ``float32``); tensors are converted on read.
      strict: raise on checkpoint tensors the model does not use (else ignore them).

    Returns:
      Model.

    Example:
      >>> model = load_model("Qwen2.5-0.5B")
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint directory not found: {path}")
    cfg = ModelConfig.from_json_file(os.path.join(path, "config.json"))
    cfg = cfg.replace(dtype=numpy_dtype(dtype or "float32").name)
    target = numpy_dtype(cfg.dtype)
    abstract = _abstract_params(cfg)
    expected = {name: (loc, leaf.shape) for name, loc, leaf in _named_leaves(cfg, abstract)}

    files = _weight_files(path)
    headers = {file: read_header(file) if os.path.isfile(file) else None for file in files}
    found: dict[str, str] = {}
    unexpected = []
    for file, header in headers.items():
        if header is None:
            raise CheckpointError(f"{file}: shard listed in {INDEX_FILE} is missing")
        for name, info in header[1].items():
            if name not in expected:
                tied_head = name == "lm_head.weight" and cfg.tie_word_embeddings
                if not (tied_head or name.endswith(IGNORED_SUFFIXES)):
                    unexpected.append(name)
                continue
            want = tuple(expected[name][1])
            if info.shape != want:
                raise CheckpointError(f"{file}: tensor {name!r} has shape {info.shape}, expected {want} "
                                      f"for this config.json")
            found[name] = file
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CheckpointError(f"{path}: checkpoint is missing {len(missing)} tensor(s): {missing[:10]}")
    if unexpected and strict:
        raise CheckpointError(f"{path}: checkpoint has {len(unexpected)} tensor(s) this model does not use: "
                              f"{sorted(unexpected)[:10]} (load with strict=False to ignore them)")

    params = jax.tree.map(lambda _: None, abstract)
    for file, header in headers.items():
        wanted = {name: target for name, f in found.items() if f == file}
        for name, array in read_tensors(file, wanted, header):
            _set(params, expected[name][0], array)
    return Model(config=cfg, params=params)


def _shards(named: list[tuple[str, np.ndarray]], max_shard_bytes: int | None) -> list[list[tuple[str, np.ndarray]]]:
    if not max_shard_bytes:
        return [named]
    shards, current, size = [], [], 0
    for name, arr in named:
        if current and size + arr.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, arr))
        size += arr.nbytes
    return shards + [current] if current else shards


def _is_weights_file(name: str) -> bool:
    return name == "config.json" or (name.startswith("model") and ".safetensors" in name)


def _carry_other_files(old_dir: str, new_dir: str) -> None:
    """Keeps what else lives in a checkpoint directory being replaced (tokenizer, generation config)."""
    for name in os.listdir(old_dir):
        if _is_weights_file(name) or os.path.exists(os.path.join(new_dir, name)):
            continue
        src, dst = os.path.join(old_dir, name), os.path.join(new_dir, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)


def save_hf(model: Model, path: str | os.PathLike, dtype: str | None = None,
            max_shard_bytes: int | None = None) -> None:
    """Writes ``config.json`` + safetensors that ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

    The directory is written to a temporary sibling and renamed into place, so a failure leaves
    neither a partial checkpoint nor a damaged previous one.

    Args:
      model: the Model to save.
      path: output directory (created; the weights and config.json of an existing checkpoint there
        are replaced, its other files such as the tokenizer are kept).
      dtype: tensor dtype in the files (default: the model's).
      max_shard_bytes: split into ``model-0000k-of-0000n.safetensors`` shards plus an index.

    Example:
      >>> save_hf(model, "out/step_1000", dtype="bfloat16")
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise NotADirectoryError(f"save_hf: cannot write {path}: parent {parent} is not a directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"save_hf: cannot write {path}: it exists and is not a directory")
    cfg = model.config
    out_dtype = numpy_dtype(dtype or cfg.dtype)
    named = [(n, np.asarray(a).astype(out_dtype, copy=False)) for n, a in to_hf_state_dict(cfg, model.params).items()]
    config_json = cfg.replace(dtype=out_dtype.name).to_hf_dict()
    try:
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    except OSError as e:
        raise PermissionError(f"save_hf: cannot write into {parent}: {e}") from None
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config_json, f, indent=2)
        shards = _shards(named, max_shard_bytes)
        if len(shards) == 1:
            write_file(os.path.join(tmp, SINGLE_FILE), shards[0])
        else:
            weight_map = {}
            for k, shard in enumerate(shards):
                file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
                write_file(os.path.join(tmp, file), shard)
                weight_map.update({name: file for name, _ in shard})
            total = sum(a.nbytes for _, a in named)
            with open(os.path.join(tmp, INDEX_FILE), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        if os.path.exists(path):
            _carry_other_files(path, tmp)
            old = path + ".old-" + os.path.basename(tmp)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
