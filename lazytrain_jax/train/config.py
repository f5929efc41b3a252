"""Typed configuration of a training run: frozen dataclasses loaded from YAML or JSON.

Unknown keys are rejected with the closest valid key suggested; ``--set section.key=value``
overrides any key (the value is parsed as YAML and checked against the field's type).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import types
import typing
from typing import Any, Mapping


def _f(default, help_text: str):
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help_text})
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    path: str | None = _f(None, "Hugging Face model directory (config.json + safetensors) to fine-tune")
    preset: str | None = _f(None, "or a preset name (lt.PRESETS) to initialise randomly")
    overrides: dict = _f({}, "ModelConfig fields replacing the preset's (e.g. {vocab_size: 320})")
    init_seed: int = _f(0, "seed of the random initialisation (preset only)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection:
    train_file: str | None = _f(None, "MetaMathQA-format JSONL (query, response, optional type)")
    eval_file: str | None = _f(None, "held-out JSONL for exact-match accuracy (optional)")
    tokenizer: str | None = _f(None, "local tokenizer directory (default: model.path)")
    seq_len: int = _f(512, "tokens per sequence: longer examples are truncated, shorter ones padded")
    template: str = _f("auto", "prompt format: auto (chat template if any, else plain) | chat | plain")
    plain_prompt: str = _f("Question: {query}\nAnswer: ", "the plain prompt template ({query} is replaced)")
    skip_bad_lines: bool = _f(False, "skip malformed JSONL lines (counted) instead of stopping")
    num_eval: int | None = _f(None, "evaluate on the first N held-out examples (default: all)")
    max_new_tokens: int = _f(256, "generation budget per eval example")
    eval_batch_size: int = _f(64, "prompts per generation batch")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimSection:
    learning_rate: float = _f(1e-5, "peak learning rate (paper recipe: 1e-5)")
    weight_decay: float = _f(0.01, "decoupled weight decay")
    max_grad_norm: float | None = _f(1.0, "global-norm clipping threshold (null: none)")
    b1: float = _f(0.9, "Adam beta1")
    b2: float = _f(0.999, "Adam beta2")
    eps: float = _f(1e-8, "Adam epsilon")
    warmup_steps: int | None = _f(None, "linear warm-up steps (default: 3% of the run)")
    schedule: str = _f("cosine", "decay after warm-up: cosine | linear | constant")
    min_lr_ratio: float = _f(0.0, "final learning rate as a fraction of the peak")
    state_format: str = _f("dynamic8", "Adam state format: dynamic8 | fp8 | fp32")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanSection:
    plan: str = _f("auto", "'auto' (profile this machine and solve) or a plan JSON file")
    hardware: str = _f("measured", "'measured' (lt.profile) or a hardware preset name for 'auto'")
    device_memory: float | None = _f(None, "device bytes the plan may use (default: free accelerator memory; "
                                           "required on the CPU backend)")
    batch_size: int | str = _f(8, "sequences per step; with plan 'auto' and hardware 'measured' also 'max' "
                                  "(the largest that fits) or 'best' (the most tokens/s)")
    num_micro_batches: int | None = _f(None, "fix the micro-batch count (default: planner's choice)")
    stream_dtype: str = _f("bfloat16", "dtype of the weights streamed to the device")
    offload_dir: str | None = _f(None, "directory for NVMe-tier activations")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    steps: int | None = _f(None, "optimizer steps (or give epochs)")
    epochs: float | None = _f(None, "passes over the training data (when steps is not given)")
    eval_every: int | None = _f(None, "evaluate every N steps (and at the end when eval data is given)")
    checkpoint_dir: str | None = _f(None, "directory of crash-safe checkpoints (resume reads it)")
    checkpoint_every: int | None = _f(None, "checkpoint every N steps (and at the end)")
    keep_last: int = _f(3, "checkpoints kept")
    log_dir: str | None = _f(None, "JSONL log, summary and PNGs")
    export_dir: str | None = _f(None, "write the final weights as a Hugging Face directory")
    seed: int = _f(0, "data shuffling seed")
    resume: bool = _f(True, "continue from the latest checkpoint in checkpoint_dir")
    progress: bool = _f(True, "show a progress bar")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A whole run: ``lazytrain train CONFIG.yaml``. Example: ``TrainConfig.load("run.yaml", ["train.steps=10"])``."""

    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    data: DataSection = dataclasses.field(default_factory=DataSection)
    optim: OptimSection = dataclasses.field(default_factory=OptimSection)
    plan: PlanSection = dataclasses.field(default_factory=PlanSection)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        """Builds a config, rejecting unknown keys (with the closest valid key) and wrong types."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a config must be a mapping of sections {section_names()}; got {type(d).__name__}")
        sections = {}
        for name, value in d.items():
            if name not in SECTIONS:
                raise ValueError(f"unknown config key {name!r}{_suggest(name, list(SECTIONS) + all_keys())}")
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise ValueError(f"config section {name!r} must be a mapping; got {value!r}")
            kwargs = {}
            for key, item in value.items():
                full = f"{name}.{key}"
                if full not in _FIELD_TYPES:
                    raise ValueError(f"unknown config key {full!r}{_suggest(full, all_keys())}")
                kwargs[key] = _check_type(full, item, _FIELD_TYPES[full])
            sections[name] = SECTIONS[name](**kwargs)
        return cls(**sections)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def load(cls, path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> "TrainConfig":
        """Reads YAML (``.yaml``/``.yml``) or JSON, then applies ``key=value`` overrides.

        Example:
          >>> cfg = TrainConfig.load("examples/config_metamathqa.yaml", ["train.steps=5"])
        """
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"config file {path!r} does not exist")
        try:
            with open(path, encoding="utf-8-sig") as f:   # (a byte order mark, as Windows editors write, is fine)
                text = f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                             "a config is YAML or JSON") from None
        if path.endswith((".yaml", ".yml")):
            import yaml
            try:
                d = yaml.safe_load(text) or {}
            except yaml.YAMLError as e:
                # one line: the parser's problem and where (its own message spans several)
                mark = getattr(e, "problem_mark", None)
                where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
                problem = getattr(e, "problem", None) or " ".join(str(e).split())
                raise ValueError(f"{path}{where}: not valid YAML ({problem})") from None
        else:
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        return cls.from_dict(apply_overrides(d, overrides))


SECTIONS = {"model": ModelSection, "data": DataSection, "optim": OptimSection, "plan": PlanSection,
            "train": TrainSection}


def section_names() -> list[str]:
    return list(SECTIONS)


def _hints(cls):
    return typing.get_type_hints(cls)


_FIELD_TYPES = {f"{name}.{f.name}": _hints(cls)[f.name] for name, cls in SECTIONS.items()
                for f in dataclasses.fields(cls)}


def all_keys() -> list[str]:
    return list(_FIELD_TYPES)


def _suggest(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    if not close:  # a bare key under the wrong section, e.g. "steps" for "train.steps"
        close = [c for c in candidates if c.split(".")[-1] == key.split(".")[-1]][:1]
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {candidates}"


def _check_type(key: str, value, annotation):
    allowed = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is float and isinstance(value, str):  # YAML reads 1e-5 as a string
            try:
                return float(value)
            except ValueError:
                pass
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind in (str, bool, dict) and isinstance(value, kind):
            return value
    names = " or ".join("null" if k is type(None) else k.__name__ for k in allowed)
    raise ValueError(f"config key {key!r}: {value!r} is not a valid {names}")


def apply_overrides(d: Mapping[str, Any], overrides) -> dict:
    """``section.key=value`` pairs applied to a nested dict (values parsed as YAML)."""
    import yaml

    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in dict(d).items()}
    for pair in overrides:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--set {pair!r}: expected section.key=value, e.g. --set train.steps=100")
        if key not in _FIELD_TYPES:
            raise ValueError(f"--set {pair!r}: unknown config key {key!r}{_suggest(key, all_keys())}")
        section, name = key.split(".", 1)
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        out.setdefault(section, {})
        if out[section] is None:
            out[section] = {}
        out[section][name] = value
    return out


def keys_help() -> str:
    """Every key with its type, default and meaning (``lazytrain train --help``)."""
    lines = []
    for name, cls in SECTIONS.items():
        lines.append(f"{name}:")
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            kind = str(hints[f.name]).replace("typing.", "").replace("<class '", "").replace("'>", "")
            lines.append(f"  {f.name:<18} {kind:<14} default {default!r:<14} {f.metadata['help']}")
    return "\n".join(lines)
