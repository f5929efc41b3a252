"""Hugging Face checkpoints: load into per-unit host parameters, save loadable by transformers.

Parameter names inside a unit are Hugging Face's; a unit's prefix completes the checkpoint name:
``embed`` -> ``model.``, ``layers[i]`` -> ``model.layers.{i}.``, head ``norm`` -> ``model.norm``,
head ``lm_head`` -> ``lm_head``.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from typing import Any, Iterator

import jax
import numpy as np

from lazytrain_jax.atomic import make_temp_dir
from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.container import Model, numpy_dtype
from lazytrain_jax.model.qwen35_config import is_hybrid
from lazytrain_jax.model.safetensors_io import DTYPE_NAMES, CheckpointError, read_header, read_tensors, write_file
from lazytrain_jax.model.units import get_units

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors some checkpoints carry that the model does not use.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Multimodal Qwen3.5/3.6 checkpoints (Qwen3_5ForConditionalGeneration) keep the language model
# under this prefix, next to the vision tower and the multi-token-prediction head, which are not
# part of the language model (transformers' Qwen3_5ForCausalLM skips them too).
MULTIMODAL_TEXT_PREFIX = "model.language_model."
MULTIMODAL_SKIPPED_PREFIXES = ("model.visual.", "mtp.")


def _checkpoint_layout(cfg: ModelConfig, headers: dict) -> tuple[str, tuple[str, ...]]:
    """(prefix that replaces ``model.`` in checkpoint names, prefixes of tensors to skip)."""
    if is_hybrid(cfg) and any(n.startswith(MULTIMODAL_TEXT_PREFIX) for h in headers.values() if h for n in h[1]):
        return MULTIMODAL_TEXT_PREFIX, MULTIMODAL_SKIPPED_PREFIXES
    return "model.", ()


def _in_checkpoint(name: str, text_prefix: str) -> str:
    return text_prefix + name[len("model."):] if name.startswith("model.") else name


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
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
        weight_map = d.get("weight_map") if isinstance(d, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: a safetensors index must be a JSON object with a 'weight_map' object "
                                  f"(tensor name -> file name); got weight_map={weight_map!r:.100}")
        files: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            if not isinstance(file, str) or not file or os.path.basename(file) != file or file in (".", ".."):
                raise CheckpointError(f"{index}: weight_map[{name!r}]={file!r} must be the name of a file in {path}")
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
    files = _weight_files(path)
    headers = {file: read_header(file) if os.path.isfile(file) else None for file in files}
    text_prefix, skipped_prefixes = _checkpoint_layout(cfg, headers)
    expected = {_in_checkpoint(name, text_prefix): (loc, leaf.shape) for name, loc, leaf in _named_leaves(cfg, abstract)}
    found: dict[str, str] = {}
    unexpected, skipped = [], []
    for file, header in headers.items():
        if header is None:
            raise CheckpointError(f"{file}: shard listed in {INDEX_FILE} is missing")
        for name, info in header[1].items():
            if name.startswith(skipped_prefixes):
                skipped.append(name)
                continue
            if name not in expected:
                tied_head = name == "lm_head.weight" and cfg.tie_word_embeddings
                if not (tied_head or name.endswith(IGNORED_SUFFIXES)):
                    unexpected.append(name)
                continue
            if info.dtype.kind != "f" and info.dtype.name != "bfloat16":
                raise CheckpointError(f"{file}: tensor {name!r} has dtype {DTYPE_NAMES[info.dtype]}; a weight must be "
                                      f"a float tensor (F32, BF16, F16 or F64)")
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

    if skipped:
        warnings.warn(f"{path}: loaded the language model only; skipped {len(skipped)} vision-tower / "
                      f"multi-token-prediction tensor(s) ({', '.join(sorted(skipped)[:3])}, ...)", stacklevel=2)
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


# What save_hf will replace: a directory holding only these regular files (our own checkpoints,
# plus the generation config transformers writes beside them). Anything else is refused.
CHECKPOINT_NAMES = ("config.json", "generation_config.json", INDEX_FILE)
CHECKPOINT_SUFFIX = ".safetensors"


class SaveTargetError(FileExistsError, ValueError):
    """``save_hf`` refuses a target: it exists and is not a directory it may replace."""


def _is_checkpoint_file(directory: str, name: str) -> bool:
    full = os.path.join(directory, name)
    return ((name in CHECKPOINT_NAMES or name.endswith(CHECKPOINT_SUFFIX))
            and not os.path.islink(full) and os.path.isfile(full))


def _replaceable_names(path: str) -> list[str]:
    """The files of an existing target that save_hf may delete; raises unless all are checkpoint files."""
    if os.path.islink(path):
        raise SaveTargetError(f"save_hf: refusing to write {path}: it is a symbolic link (save_hf never "
                              f"follows links); give the real directory or a new path")
    if not os.path.isdir(path):
        raise SaveTargetError(f"save_hf: cannot write {path}: it exists and is not a directory")
    real, cwd = os.path.realpath(path), os.path.realpath(os.getcwd())
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        raise SaveTargetError(f"save_hf: refusing to replace {path}: it is (or contains) the current working "
                              f"directory {cwd}; give a new directory")
    names = sorted(os.listdir(path))
    foreign = [n for n in names if not _is_checkpoint_file(path, n)]
    if foreign:
        raise SaveTargetError(
            f"save_hf: refusing to replace {path}: it holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} "
            f"that are not checkpoint files: {foreign[:10]}. save_hf writes a new directory, or replaces one "
            f"holding only regular files named {list(CHECKPOINT_NAMES)} or *{CHECKPOINT_SUFFIX}; give a new path")
    if names and "config.json" not in names:
        raise SaveTargetError(f"save_hf: refusing to replace {path}: it has files {names[:10]} but no config.json, "
                              f"so it is not a checkpoint; give a new path")
    return names


def _model_dtype(model: Model) -> np.dtype:
    """The params' common floating dtype (the config's when they differ)."""
    dtypes = {np.dtype(getattr(leaf, "dtype", np.float32)) for leaf in jax.tree.leaves(model.params)}
    if len(dtypes) == 1:
        (only,) = dtypes
        if only.name in ("float32", "bfloat16", "float16"):
            return numpy_dtype(only.name)
    return numpy_dtype(model.config.dtype)


def _swap_in(tmp: str, path: str) -> None:
    """Moves the finished ``tmp`` directory to ``path``; an existing checkpoint there is moved aside
    by rename and its files deleted one by one (never a tree copy or a recursive delete)."""
    if not os.path.lexists(path):
        os.rename(tmp, path)
        return
    names = _replaceable_names(path)  # again: the directory may have changed while we wrote
    old = tmp + ".old"
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(old, name))
    try:
        os.rmdir(old)
    except OSError:
        left = sorted(os.listdir(old)) if os.path.isdir(old) else []
        warnings.warn(f"save_hf: the previous checkpoint of {path} was moved to {old}, which gained files while "
                      f"saving ({left[:10]}); it was left in place", RuntimeWarning, stacklevel=3)


def save_hf(model: Model, path: str | os.PathLike, dtype: str | None = None,
            max_shard_bytes: int | None = None) -> None:
    """Writes ``config.json`` + safetensors that ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

    ``path`` is a new directory, an empty one, or a checkpoint this function may replace: a real
    directory (not a symbolic link, not the working directory) holding only regular files named
    ``config.json``, ``generation_config.json``, ``model.safetensors.index.json`` or
    ``*.safetensors``. Anything else (a tokenizer beside the weights, a project folder, ``/``) is
    refused with ``SaveTargetError`` and left untouched. The new checkpoint is written into a
    temporary sibling directory and renamed into place; the old one is renamed aside and its files
    deleted. A failure leaves neither a partial checkpoint nor a damaged previous one. Files and
    directories get the permissions of the user's umask.

    Args:
      model: the Model to save.
      path: output directory.
      dtype: tensor dtype in the files (``float32`` | ``bfloat16`` | ``float16``; default: the
        model's, i.e. the parameters' dtype).
      max_shard_bytes: split into ``model-0000k-of-0000n.safetensors`` shards plus an index.

    Raises:
      SaveTargetError: (a ValueError and a FileExistsError) the target may not be replaced.
      NotADirectoryError: the parent directory does not exist.

    Example:
      >>> save_hf(model, "out/step_1000", dtype="bfloat16")
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise NotADirectoryError(f"save_hf: cannot write {path}: parent {parent} is not a directory")
    if os.path.lexists(path):
        _replaceable_names(path)
    if max_shard_bytes is not None and (isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int)
                                        or max_shard_bytes <= 0):
        raise ValueError(f"save_hf: max_shard_bytes={max_shard_bytes!r} must be a positive integer or None")
    cfg = model.config
    out_dtype = numpy_dtype(dtype) if dtype is not None else _model_dtype(model)
    named = [(n, np.asarray(a).astype(out_dtype, copy=False)) for n, a in to_hf_state_dict(cfg, model.params).items()]
    config_json = cfg.replace(dtype=out_dtype.name).to_hf_dict()
    try:
        tmp = make_temp_dir(parent, os.path.basename(path))
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
        _swap_in(tmp, path)
    except BaseException:
        if os.path.isdir(tmp):
            for name in os.listdir(tmp):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(tmp, name))
            with contextlib.suppress(OSError):
                os.rmdir(tmp)
        raise
