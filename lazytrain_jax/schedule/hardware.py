"""Hardware: the memory budgets, link bandwidths and rates the planner plans against.

Every field is a plain number (bytes, bytes/s, FLOP/s, parameters/s), so a plan for a 27B model
needs no accelerator. Presets are datasheet leads (see ``PRESET_SOURCES``); calibrate them with
measurements (``Hardware.preset("h800", h2d_bw=12e9)``): where a preset and a measurement disagree,
the measurement wins.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping

GB = 1e9


def dataclass_from_dict(cls, d: Mapping[str, Any]):
    """``cls(**d)`` for a dataclass, rejecting unknown keys with the list of valid ones."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field {unknown[0]!r}; valid: {sorted(fields)}")
    return cls(**d)

GIB = 2**30


def check_positive_int(name: str, value, *, minimum: int = 1) -> int:
    """``value`` if it is an integer >= ``minimum`` (bools refused), else ValueError naming ``name``.

    Example:
      >>> check_positive_int("batch_size", 8)
      8
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        valid = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name}={value!r} must be {valid}")
    return value

_POSITIVE = ("device_memory", "h2d_bw", "d2h_bw", "nvme_read_bw", "nvme_write_bw", "host_opt_rate",
             "device_flops")
_NON_NEGATIVE = ("host_memory", "nvme_memory", "device_margin", "efficiency_half_tokens")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hardware:
    """One accelerator with its host: budgets (bytes), bandwidths (bytes/s) and rates.

    Args:
      name: preset name or a free label.
      device_memory: device memory the plan may use, bytes (the budget, before ``device_margin``).
      host_memory: host memory available for *activations* (boundaries offloaded to host and NVMe
        staging), bytes; master weights and optimizer state are budgeted by the optimizer, not here.
      nvme_memory: NVMe space for activations, bytes (0 disables the NVMe tier).
      h2d_bw, d2h_bw: achieved host-to-device / device-to-host bandwidth, bytes/s (separate links).
      nvme_read_bw, nvme_write_bw: achieved NVMe read / write bandwidth, bytes/s.
      host_opt_rate: host optimizer throughput, parameters/s (clip + Adam + master update + cast).
      device_flops: achieved dense bf16 FLOP/s of the device at large calls.
      efficiency_half_tokens: tokens per call at which the achieved rate is half of
        ``device_flops`` (the rate of a call of t tokens is ``device_flops * t / (t + this)``).
      device_margin: bytes always reserved on the device (allocator, runtime, fragmentation).
      host_shares_device: the device computes on the host's own cores (JAX's CPU backend): the host
        optimizer and the "transfers" (memory copies) then take their time from the compute instead
        of running beside it, so a window lasts the sum of its loads (``schedule.steps``). False
        for an accelerator.

    Example:
      >>> hw = Hardware.preset("h800", h2d_bw=12e9, d2h_bw=12e9)
      >>> hw.device_memory
      80000000000.0
    """

    name: str = "custom"
    device_memory: float
    host_memory: float = 64 * GB
    nvme_memory: float = 0.0
    h2d_bw: float
    d2h_bw: float
    nvme_read_bw: float = 2.83 * GB
    nvme_write_bw: float = 3.35 * GB
    host_opt_rate: float = 1.0e9
    device_flops: float
    efficiency_half_tokens: float = 256.0
    device_margin: float = 1.0 * GB
    host_shares_device: bool = False

    def __post_init__(self):
        if not isinstance(self.host_shares_device, bool):
            raise ValueError(f"Hardware.host_shares_device={self.host_shares_device!r} must be True or False")
        for name in _POSITIVE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Hardware.{name}={value!r} must be a number > 0")
            object.__setattr__(self, name, float(value))
        for name in _NON_NEGATIVE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"Hardware.{name}={value!r} must be a number >= 0")
            object.__setattr__(self, name, float(value))
        if self.device_margin >= self.device_memory:
            raise ValueError(f"Hardware.device_margin={self.device_margin:g} must be below "
                             f"device_memory={self.device_memory:g}")

    @classmethod
    def preset(cls, name: str, **overrides) -> "Hardware":
        """A named preset with any field overridden.

        Args:
          name: one of ``PRESETS`` (rtx3090, rtx4090, a100-80g, h800, h100, h200).
          **overrides: any Hardware field.
        Returns:
          The Hardware.
        Example:
          >>> Hardware.preset("rtx3090", host_memory=32e9)
        """
        if not isinstance(name, str) or name not in PRESETS:
            close = difflib.get_close_matches(str(name), PRESETS, n=3)
            hint = f" Did you mean {close}?" if close else ""
            raise ValueError(f"unknown hardware preset {name!r}.{hint} Valid presets: {sorted(PRESETS)}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            close = difflib.get_close_matches(unknown[0], fields, n=1)
            raise ValueError(f"unknown Hardware field {unknown[0]!r}"
                             + (f"; did you mean {close[0]!r}?" if close else f"; valid: {sorted(fields)}"))
        return cls(**{"name": name, **PRESETS[name], **overrides})

    def replace(self, **changes) -> "Hardware":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Hardware":
        return dataclass_from_dict(cls, d)


def as_hardware(hardware: "Hardware | str", **overrides) -> Hardware:
    """A Hardware from a preset name or a Hardware (with overrides applied)."""
    if isinstance(hardware, Hardware):
        return hardware.replace(**overrides) if overrides else hardware
    if isinstance(hardware, str):
        return Hardware.preset(hardware, **overrides)
    raise ValueError(f"hardware={hardware!r} must be a Hardware or a preset name; valid: {sorted(PRESETS)}")


# Achieved rates are leads: ~60% of dense bf16 peak for device_flops, ~75% of the PCIe theoretical
# rate per direction, except H800/H100 where LazyTrain measured 12 GB/s each way. NVMe defaults are
# LazyTrain's measured 2.83 read / 3.35 write GB/s. Calibrate on your machine.
PRESETS: dict[str, dict[str, float]] = {
    # RTX 3090: 24 GiB GDDR6X, 71 dense bf16 TFLOPS (tensor), PCIe 4.0 x16 (32 GB/s theoretical).
    "rtx3090": dict(device_memory=24 * GIB, h2d_bw=24 * GB, d2h_bw=24 * GB, device_flops=0.6 * 71e12,
                    host_memory=64 * GB),
    # RTX 4090: 24 GiB, ~165 dense bf16 TFLOPS, PCIe 4.0 x16.
    "rtx4090": dict(device_memory=24 * GIB, h2d_bw=24 * GB, d2h_bw=24 * GB, device_flops=0.6 * 165e12,
                    host_memory=64 * GB),
    # A100 80GB: 312 dense bf16 TFLOPS, PCIe 4.0 x16.
    "a100-80g": dict(device_memory=80 * GB, h2d_bw=24 * GB, d2h_bw=24 * GB, device_flops=0.6 * 312e12,
                     host_memory=256 * GB),
    # H800 SXM: 80 GB, ~989 dense bf16 TFLOPS; PCIe 5.0 x16 with 64 GB/s theoretical, but LazyTrain
    # measured 12 GB/s each way; its paper budgets: 15 GB host and 32 GB NVMe for activations.
    "h800": dict(device_memory=80 * GB, h2d_bw=12 * GB, d2h_bw=12 * GB, device_flops=0.6 * 989e12,
                 host_memory=15 * GB, nvme_memory=32 * GB),
    # H100 SXM: 80 GB, ~989 dense bf16 TFLOPS, PCIe 5.0 x16 (the 12 GB/s LazyTrain measurement).
    "h100": dict(device_memory=80 * GB, h2d_bw=12 * GB, d2h_bw=12 * GB, device_flops=0.6 * 989e12,
                 host_memory=256 * GB),
    # H200: 141 GB HBM3e, ~989 dense bf16 TFLOPS (a bf16 8192^3 matmul measured 769-798 TFLOP/s),
    # PCIe 5.0 x16.
    "h200": dict(device_memory=141 * GB, h2d_bw=48 * GB, d2h_bw=48 * GB, device_flops=0.78 * 989e12,
                 host_memory=256 * GB),
}

PRESET_SOURCES = {
    "rtx3090": "NVIDIA GeForce RTX 3090 datasheet: 24 GB, 71 dense bf16 TFLOPS, PCIe 4.0 x16",
    "rtx4090": "NVIDIA GeForce RTX 4090 datasheet: 24 GB, ~165 dense bf16 TFLOPS, PCIe 4.0 x16",
    "a100-80g": "NVIDIA A100 80GB datasheet: 80 GB, 312 dense bf16 TFLOPS, PCIe 4.0 x16",
    "h800": "NVIDIA H800 SXM: 80 GB, ~989 dense bf16 TFLOPS; PCIe 12 GB/s per direction as measured by LazyTrain (arXiv 2608.11919)",
    "h100": "NVIDIA H100 SXM datasheet: 80 GB, ~989 dense bf16 TFLOPS, PCIe 5.0 x16 (12 GB/s as measured on H800 by LazyTrain)",
    "h200": "NVIDIA H200 datasheet: 141 GB, ~989 dense bf16 TFLOPS (a bf16 8192^3 matmul measured 769-798 TFLOP/s), PCIe 5.0 x16",
}
