"""The ``lazytrain`` command.

Subcommands:
  demo    train a tiny Qwen3 from scratch on 2-digit +/- through the streaming engine; exact match
  train   train as a YAML/JSON config says (lt.train); eval, profile, export: see --help of each
  info    print the shape and parameter count of a preset or a Hugging Face checkpoint directory
  plan    plan a training step (MILP) for a model on a hardware preset; print it, save it as JSON
  version print the version
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys


def _model_config(name: str):
    """A ModelConfig from a preset name or a checkpoint directory (a missing path is named as such)."""
    from lazytrain_jax.model.config import PRESETS, ModelConfig, get_preset

    if os.path.isdir(name):
        return ModelConfig.from_json_file(os.path.join(name, "config.json"))
    if name in PRESETS:
        return get_preset(name)
    if os.path.lexists(name):
        raise ValueError(f"model {name!r} is a file; give a preset name or a checkpoint directory "
                         f"(with config.json)")
    if os.sep in name or name.startswith((".", "~")) or (os.altsep and os.altsep in name):
        raise FileNotFoundError(f"checkpoint directory not found: {name!r} (give a preset name or an existing "
                                f"directory with config.json; presets: {sorted(PRESETS)})")
    return get_preset(name)  # raises: unknown preset, with suggestions


def _info(args) -> int:
    cfg = _model_config(args.model)
    print(f"model_type {cfg.model_type}")
    for field in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                  "vocab_size", "tie_word_embeddings"):
        print(f"{field:<20} {getattr(cfg, field)}")
    print(f"{'parameters':<20} {cfg.num_params():,}")
    return 0


def _batch_size(text: str):
    if text in ("max", "best"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch-size={text!r}: expected a positive integer, 'max' or 'best'")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--batch-size={value} must be a positive integer, 'max' or 'best'")
    return value


def _hardware_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: expected FIELD=NUMBER, e.g. --set h2d_bw=12e9")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--set {pair!r}: {value!r} is not a number") from None
        if not math.isfinite(number):
            raise ValueError(f"--set {pair!r}: {key} must be a finite number, e.g. --set {key}=24e9")
        out[key] = number
    return out


def _number(flag: str, low: float, high: float | None, low_open: bool):
    """An argparse type: a finite float in [low, high) (or (low, high) when ``low_open``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={text!r} is not a number") from None
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and (high is None or value < high)
        if not ok:
            valid = f"{'(' if low_open else '['}{low:g}, {'inf' if high is None else f'{high:g}'})"
            raise argparse.ArgumentTypeError(f"{flag}={text} must be a number in {valid}")
        return value
    return parse


def _int_at_least(flag: str, low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag}={value} must be an integer >= {low}")
        return value
    return parse


GIB = 2**30


def host_footprint(plan, config) -> dict[str, float]:
    """Host bytes of a training step under ``plan`` (``schedule.host.footprint``)."""
    from lazytrain_jax.schedule.host import footprint
    return footprint(plan, config)


def _plan(args) -> int:
    from lazytrain_jax.atomic import check_writable_file_path
    from lazytrain_jax.schedule.api import plan
    from lazytrain_jax.schedule.hardware import Hardware

    for path in (args.out, args.trace, args.png):
        if path:
            check_writable_file_path(path)  # before solving, not after
    config = _model_config(args.model)
    label = os.path.basename(os.path.normpath(args.model)) if os.path.isdir(args.model) else args.model
    hardware = Hardware.preset(args.hardware, **_hardware_overrides(args.set))
    # options not given are absent (argparse.SUPPRESS), so lt.plan's own defaults apply
    solver = {param: getattr(args, option) for param, option in (("rel_gap", "rel_gap"), ("time_limit_s", "time_limit"))
              if hasattr(args, option)}
    result = plan(config, hardware, batch_size=args.batch_size, seq_len=args.seq_len, **solver)
    result = result.replace(costs=dataclasses.replace(result.costs, model_name=label))
    print(result.explain())
    host = host_footprint(result, config)
    print(f"host (estimate) {host.pop('total') / GIB:.2f} GiB = "
          + " + ".join(f"{name} {value / GIB:.2f}" for name, value in host.items())
          + f"; available for activations: {hardware.host_memory / GIB:.2f} GiB")
    if args.out:
        result.save(args.out)
        print(f"plan saved to {args.out}")
    if args.trace or args.png:
        from lazytrain_jax.schedule.simulator import simulate
        from lazytrain_jax.schedule.trace import save_chrome_trace, save_gantt_png
        predicted = simulate(result)
        if args.trace:
            save_chrome_trace(predicted, args.trace)
            print(f"predicted trace saved to {args.trace} (Chrome/Perfetto JSON)")
        if args.png:
            save_gantt_png(predicted, args.png, title=f"{label} on {hardware.name}: predicted step "
                                                      f"{predicted.step_time_s:.3f} s")
            print(f"predicted Gantt chart saved to {args.png}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from lazytrain_jax import __version__

    # defaults in every help line; descriptions (the train command's key list) kept as written
    fmt = type("HelpFormatter", (argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter), {})
    parser = argparse.ArgumentParser(prog="lazytrain", description=__doc__.split("\n\n")[0], formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"lazytrain_jax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{demo,train,eval,profile,export,info,plan,version}")
    from lazytrain_jax.train.commands import register
    register(sub)  # demo, train, eval, profile, export
    for command in sub.choices.values():
        command.formatter_class = fmt
    info = sub.add_parser("info", help="shape and parameter count of a preset or checkpoint directory",
                          formatter_class=fmt)
    info.add_argument("model", help="preset name or Hugging Face checkpoint directory")
    info.set_defaults(func=_info)
    plan = sub.add_parser("plan", help="plan a step (MILP) for a model on a hardware preset", formatter_class=fmt)
    plan.add_argument("model", help="preset name or Hugging Face checkpoint directory")
    plan.add_argument("--hardware", default="rtx3090", help="hardware preset (rtx3090, h800, ...)")
    plan.add_argument("--set", action="append", default=[], metavar="FIELD=NUMBER",
                      help="override a hardware field, e.g. --set h2d_bw=12e9 (repeatable)")
    plan.add_argument("--batch-size", type=_batch_size, default="max",
                      help="sequences per step: an integer, 'max' (largest that fits) or 'best' (most tokens/s)")
    plan.add_argument("--seq-len", type=_int_at_least("--seq-len", 1), default=1024, help="tokens per sequence")
    plan.add_argument("--rel-gap", type=_number("--rel-gap", 0.0, 1.0, False), default=argparse.SUPPRESS,
                      help="relative optimality gap at which the solver stops, in [0, 1) (default: lt.plan's)")
    plan.add_argument("--time-limit", type=_number("--time-limit", 0.0, None, True), default=argparse.SUPPRESS,
                      help="seconds of each MILP's solve in all (> 0; branch and bound stops there, the best plan "
                           "and its gap are reported) (default: lt.plan's)")
    plan.add_argument("--out", default=None, help="save the plan as JSON (atomically); checked before solving")
    plan.add_argument("--trace", default=None,
                      help="write the simulated step as a Chrome/Perfetto trace JSON (checked before solving)")
    plan.add_argument("--png", default=None, help="write the simulated step as a Gantt chart PNG (needs matplotlib)")
    plan.set_defaults(func=_plan)
    version = sub.add_parser("version", help="print the version", formatter_class=fmt)
    version.set_defaults(func=_version)
    return parser


def _version(args) -> int:
    from lazytrain_jax import __version__
    from lazytrain_jax.host_alloc import huge_pages_on
    print(f"lazytrain_jax {__version__}")
    print(f"host allocator: huge pages for large blocks {'on' if huge_pages_on() else 'off'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command (``argv``: its arguments; None: the process's, and then the process first starts
    itself again with huge pages for glibc's large host blocks: ``host_alloc.reexec_with_huge_pages``)."""
    if argv is None:
        from lazytrain_jax.host_alloc import reexec_with_huge_pages
        reexec_with_huge_pages()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from lazytrain_jax.host_alloc import keep_host_blocks_once
    keep_host_blocks_once()  # steps reuse freed host buffers instead of page-faulting fresh ones
    try:
        return args.func(args)
    except (ValueError, OSError) as e:  # bad input; unreadable input or unwritable --out path
        print(f"lazytrain: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
