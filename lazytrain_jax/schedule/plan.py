"""Plan: the decisions the executor carries out, what they were solved for, and what they predict.

A Plan is a frozen dataclass with a versioned JSON round trip. It embeds the Costs and Hardware it
was solved for, so it can be simulated, explained and checked against a model without the planner.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from lazytrain_jax.schedule import memory, steps
from lazytrain_jax.schedule.costs import Costs
from lazytrain_jax.schedule.hardware import Hardware

PLAN_VERSION = 1
OPTIMIZER_MODES = ("pipelined", "serial")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """One step's schedule for a model, batch and sequence length on one hardware.

    Decisions:
      boundary_tiers: L + 1 entries in ``device | host | nvme | drop`` (0 and L on device; NVMe only
        for boundaries 1..L-3, whose write and read windows are then ordered). A dropped run of
        boundaries between kept s and e is recomputed from s when the backward pass enters the
        segment (``segments``); layer j is recomputed iff boundary j + 1 is dropped.
      keep_residuals: per layer, keep the interior residuals from forward (skip its in-layer recompute).
      offload_residuals: per layer, keep those residuals in host memory rather than on the device:
        copied down after the layer's forward, fetched back ahead of its backward (only where
        ``keep_residuals`` holds, and for layers 0..L-2: ``steps.residual_offload_allowed``).
        Empty (the default, and every plan written before the field existed) means no offload.
      resident_tail: the last k layers keep their weights on device from forward into backward.
      weight_prefetch_depth, act_prefetch_depth: look-ahead of weight and activation transfers.
      optimizer_mode: ``pipelined`` (host update of each unit overlapped with the next step's
        forward) or ``serial`` (the whole update before the next step, MegaTrain's tail).
      costs: the Costs solved for (batch_size, seq_len and num_micro_batches live there).
      hardware: the Hardware solved for.
    Predictions and provenance:
      name (``milp`` or a heuristic), predicted_step_time_s, predicted_peak_device_bytes,
      predicted_peak_host_bytes, predicted_peak_nvme_bytes, solver_status, gap, solve_time_s.

    Example:
      >>> plan = lt.plan("qwen2.5-7b", "rtx3090", batch_size=4, seq_len=1024)
      >>> Plan.from_json(plan.to_json()) == plan
      True
    """

    version: int = PLAN_VERSION
    name: str
    boundary_tiers: tuple[str, ...]
    keep_residuals: tuple[bool, ...]
    offload_residuals: tuple[bool, ...] = ()
    resident_tail: int = 0
    weight_prefetch_depth: int = 1
    act_prefetch_depth: int = 1
    optimizer_mode: str = "pipelined"
    costs: Costs
    hardware: Hardware
    predicted_step_time_s: float = 0.0
    predicted_peak_device_bytes: float = 0.0
    predicted_peak_host_bytes: float = 0.0
    predicted_peak_nvme_bytes: float = 0.0
    solver_status: str = "unsolved"
    gap: float | None = None
    solve_time_s: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "boundary_tiers", tuple(self.boundary_tiers))
        object.__setattr__(self, "keep_residuals", tuple(bool(r) for r in self.keep_residuals))
        offload = tuple(self.offload_residuals) or (False,) * self.costs.num_layers
        validate_decisions(self.costs.num_layers, self.boundary_tiers, self.keep_residuals, self.resident_tail,
                           self.weight_prefetch_depth, self.act_prefetch_depth, self.optimizer_mode, offload)
        object.__setattr__(self, "offload_residuals", tuple(bool(o) for o in offload))
        if self.version != PLAN_VERSION:
            raise ValueError(f"Plan.version={self.version!r} is not supported; valid: [{PLAN_VERSION}]")

    # ---- construction ---------------------------------------------------------------------

    @classmethod
    def create(cls, costs: Costs, hardware: Hardware, *, name: str, boundary_tiers, keep_residuals=None,
               offload_residuals=None, resident_tail: int = 0, weight_prefetch_depth: int = 1,
               act_prefetch_depth: int = 1, optimizer_mode: str = "pipelined", solver_status: str = "heuristic", gap: float | None = None,
               solve_time_s: float = 0.0) -> "Plan":
        """A Plan with its predictions filled in from the timing and memory models.

        Example:
          >>> Plan.create(costs, hw, name="mine", boundary_tiers=["device"] * (costs.num_layers + 1))
        """
        from lazytrain_jax.schedule import timing
        keep = tuple(keep_residuals) if keep_residuals is not None else (False,) * costs.num_layers
        draft = cls(name=name, boundary_tiers=tuple(boundary_tiers), keep_residuals=keep,
                    offload_residuals=tuple(offload_residuals or ()), resident_tail=resident_tail,
                    weight_prefetch_depth=weight_prefetch_depth,
                    act_prefetch_depth=act_prefetch_depth, optimizer_mode=optimizer_mode, costs=costs,
                    hardware=hardware, solver_status=solver_status, gap=gap, solve_time_s=solve_time_s)
        return dataclasses.replace(
            draft, predicted_step_time_s=timing.step_time(costs, hardware, draft),
            predicted_peak_device_bytes=memory.device_peak_bytes(costs, hardware, draft),
            predicted_peak_host_bytes=memory.host_peak_bytes(costs, draft),
            predicted_peak_nvme_bytes=memory.nvme_peak_bytes(costs, draft))

    def replace(self, **changes) -> "Plan":
        return dataclasses.replace(self, **changes)

    def repredict(self, costs: Costs | None = None, hardware: Hardware | None = None, **changes) -> "Plan":
        """This plan's decisions (every one, with ``changes`` applied: any decision field or
        ``name``/``solver_status``) under ``costs``/``hardware`` (default: its own), predictions
        recomputed from the models (the solve's ``gap`` and ``solve_time_s`` are not carried). Use
        it whenever a plan is carried to other costs, another machine profile or other prefetch
        depths, so that no decision is lost on the way.

        Example:
          >>> plan.repredict(hardware=plan.hardware.replace(h2d_bw=6e9)).predicted_step_time_s
        """
        fields = dict(name=self.name, boundary_tiers=self.boundary_tiers, keep_residuals=self.keep_residuals,
                      offload_residuals=self.offload_residuals, resident_tail=self.resident_tail,
                      weight_prefetch_depth=self.weight_prefetch_depth, act_prefetch_depth=self.act_prefetch_depth,
                      optimizer_mode=self.optimizer_mode, solver_status=self.solver_status)
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"Plan.repredict: unknown field(s) {unknown}; valid: {sorted(fields)}")
        return Plan.create(self.costs if costs is None else costs, self.hardware if hardware is None else hardware,
                           **{**fields, **changes})

    # ---- derived --------------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return self.costs.num_layers

    @property
    def batch_size(self) -> int:
        return self.costs.batch_size

    @property
    def seq_len(self) -> int:
        return self.costs.seq_len

    @property
    def num_micro_batches(self) -> int:
        return self.costs.num_micro_batches

    @property
    def segments(self) -> list[tuple[int, int]]:
        """Edges (s, e) of the kept-boundary path; layers s..e-2 are recomputed when e - s >= 2."""
        return memory.segments(self.boundary_tiers)

    @property
    def recompute(self) -> tuple[bool, ...]:
        """Per layer: is its forward re-run in backward (its output boundary dropped)."""
        return tuple(t == "drop" for t in self.boundary_tiers[1:])

    @property
    def tokens_per_s(self) -> float:
        return self.costs.tokens / self.predicted_step_time_s

    @property
    def tflops(self) -> float:
        """MegaTrain's convention: 6 · parameters · tokens / step time, in TFLOP/s."""
        return 6.0 * self.costs.total_params() * self.tokens_per_s / 1e12

    def fits(self) -> bool:
        hw = self.hardware
        return (self.predicted_peak_device_bytes <= hw.device_memory * (1 + 1e-9)
                and self.predicted_peak_host_bytes <= hw.host_memory * (1 + 1e-9)
                and self.predicted_peak_nvme_bytes <= hw.nvme_memory * (1 + 1e-9))

    def explain(self) -> str:
        """A per-layer table (tier, recompute, residuals, resident, transfers) with totals."""
        from lazytrain_jax.schedule.explain import explain
        return explain(self)

    # ---- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["boundary_tiers"] = list(self.boundary_tiers)
        d["keep_residuals"] = list(self.keep_residuals)
        d["offload_residuals"] = list(self.offload_residuals)
        d["costs"] = self.costs.to_dict()
        d["hardware"] = self.hardware.to_dict()
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, expect_fingerprint: str | None = None) -> "Plan":
        """Reads a Plan dict; another version or (with ``expect_fingerprint``) another model raises.

        Every field is type-checked (with its ``costs`` and ``hardware``) before anything is built,
        so a damaged or hand-edited file raises ValueError naming the field, never KeyError/TypeError.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a Plan must be a JSON object; got {type(d).__name__}")
        version = d.get("version")
        if version != PLAN_VERSION:
            raise ValueError(f"Plan.version={version!r} is not supported; valid: [{PLAN_VERSION}]")
        check_json_fields(cls, d, "Plan")
        check_json_fields(Costs, d["costs"], "Plan.costs")
        check_json_fields(Hardware, d["hardware"], "Plan.hardware")
        plan = cls(**{**d, "costs": Costs.from_dict(d["costs"]), "hardware": Hardware.from_dict(d["hardware"])})
        if expect_fingerprint is not None and plan.costs.model_fingerprint != expect_fingerprint:
            raise ValueError(f"Plan.costs.model_fingerprint={plan.costs.model_fingerprint!r} was solved for "
                             f"another model ({plan.costs.model_name}); expected {expect_fingerprint!r}")
        return plan

    @classmethod
    def from_json(cls, text: str, *, model=None) -> "Plan":
        """Parses ``to_json`` output; ``model`` checks it was solved for that model.

        Args:
          text: the JSON text.
          model: None, or what ``lt.plan`` accepts: a Model, a ModelConfig, a preset name or a Costs.

        Example:
          >>> Plan.from_json(open("plan.json").read(), model=model)
        """
        if not isinstance(text, (str, bytes, bytearray)):
            raise ValueError(f"Plan.from_json needs the JSON text; got {type(text).__name__}")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"Plan JSON is not valid JSON ({e})") from None
        fingerprint = None
        if isinstance(model, Costs):
            fingerprint = model.model_fingerprint
        elif model is not None:
            from lazytrain_jax.model.config import resolve_config
            from lazytrain_jax.schedule.costs import config_fingerprint
            config = resolve_config(model, what="None, a Model, a ModelConfig, a preset name or a Costs")
            fingerprint = config_fingerprint(config)
        return cls.from_dict(d, expect_fingerprint=fingerprint)

    def save(self, path: str) -> None:
        """Writes the plan's JSON atomically (no half-written file on failure)."""
        from lazytrain_jax.atomic import atomic_write_text
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str, *, model=None) -> "Plan":
        with open(path) as f:
            return cls.from_json(f.read(), model=model)


def validate_decisions(num_layers: int, tiers, keep_residuals, resident_tail: int, weight_prefetch_depth: int,
                       act_prefetch_depth: int, optimizer_mode: str, offload_residuals=None) -> None:
    """Raises ValueError naming the field when a decision is outside the decision space."""
    if len(tiers) != num_layers + 1:
        raise ValueError(f"Plan.boundary_tiers has {len(tiers)} entries; expected num_layers + 1 = {num_layers + 1}")
    for i, t in enumerate(tiers):
        if t not in memory.TIERS:
            raise ValueError(f"Plan.boundary_tiers[{i}]={t!r}; valid: {list(memory.TIERS)}")
    if tiers[0] != "device" or tiers[-1] != "device":
        raise ValueError(f"Plan.boundary_tiers[0] and [{num_layers}] must be 'device'; got {tiers[0]!r}, {tiers[-1]!r}")
    for i, t in enumerate(tiers):
        if t == "nvme" and not 1 <= i <= num_layers - 3:
            raise ValueError(f"Plan.boundary_tiers[{i}]='nvme' is not allowed; NVMe holds boundaries 1..{num_layers - 3}")
    if len(keep_residuals) != num_layers:
        raise ValueError(f"Plan.keep_residuals has {len(keep_residuals)} entries; expected {num_layers}")
    if offload_residuals is not None:
        if len(offload_residuals) != num_layers:
            raise ValueError(f"Plan.offload_residuals has {len(offload_residuals)} entries; expected {num_layers} "
                             f"(or none: no offload)")
        for l, off in enumerate(offload_residuals):
            if not isinstance(off, (bool, int)) or off not in (0, 1):
                raise ValueError(f"Plan.offload_residuals[{l}]={off!r}; valid: true or false")
            if off and not keep_residuals[l]:
                raise ValueError(f"Plan.offload_residuals[{l}]=True needs Plan.keep_residuals[{l}]=True (only kept "
                                 f"residuals can be offloaded to the host)")
            if off and not steps.residual_offload_allowed(l, num_layers):
                raise ValueError(f"Plan.offload_residuals[{l}]=True is not allowed; residual offload is for layers "
                                 f"0..{num_layers - 2} (the last layer's backward follows its forward too closely)")
    if isinstance(resident_tail, bool) or not isinstance(resident_tail, int) or not 0 <= resident_tail <= num_layers:
        raise ValueError(f"Plan.resident_tail={resident_tail!r}; valid: 0..{num_layers}")
    for name, value in (("weight_prefetch_depth", weight_prefetch_depth), ("act_prefetch_depth", act_prefetch_depth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Plan.{name}={value!r} must be an integer >= 1")
    if optimizer_mode not in OPTIMIZER_MODES:
        raise ValueError(f"Plan.optimizer_mode={optimizer_mode!r}; valid: {list(OPTIMIZER_MODES)}")


def _json_type_ok(annotation: str, value: Any) -> bool:
    def number(x, finite=True):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x) and \
            (not finite or math.isfinite(x))
    item = {"str": lambda x: isinstance(x, str), "bool": lambda x: isinstance(x, bool),
            "int": lambda x: isinstance(x, int) and not isinstance(x, bool), "float": number}
    if annotation in item:
        return item[annotation](value)
    if annotation.endswith(" | None"):
        return value is None or _json_type_ok(annotation[:-len(" | None")], value)
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        check = item[annotation[len("tuple["):-len(", ...]")]]
        return isinstance(value, (list, tuple)) and all(check(x) for x in value)
    if annotation in ("Costs", "Hardware"):
        return isinstance(value, Mapping)
    raise AssertionError(f"no JSON check for annotation {annotation!r}")


_JSON_NAMES = {"str": "a string", "bool": "true or false", "int": "an integer", "float": "a finite number",
               "tuple[str, ...]": "a list of strings", "tuple[bool, ...]": "a list of true/false",
               "tuple[int, ...]": "a list of integers", "tuple[float, ...]": "a list of finite numbers",
               "Costs": "an object", "Hardware": "an object"}


def _json_name(annotation: str) -> str:
    """What a field of ``annotation`` must be, in words ("T | None": T's words "or null")."""
    if annotation.endswith(" | None"):
        return _json_name(annotation[:-len(" | None")]) + " or null"
    return _JSON_NAMES[annotation]


def check_json_fields(cls, d: Any, where: str) -> None:
    """Raises ValueError naming the field unless ``d`` is an object whose fields are those of the
    dataclass ``cls``, each of the JSON type its annotation declares (Hardware may hold +inf).

    Example:
      >>> check_json_fields(Hardware, {"device_memory": "24e9"}, "Plan.hardware")   # ValueError
    """
    if not isinstance(d, Mapping):
        raise ValueError(f"{where} must be a JSON object; got {d!r:.80}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; valid: {sorted(fields)}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if name not in d:
            if required:
                raise ValueError(f"{where}: required field {name!r} is missing")
            continue
        value, annotation = d[name], str(f.type)
        if cls is Hardware and annotation == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        else:
            ok = _json_type_ok(annotation, value)
        if not ok:
            kind = "a number (not NaN)" if cls is Hardware and annotation == "float" else _json_name(annotation)
            raise ValueError(f"{where}.{name}={value!r:.80} must be {kind}")
