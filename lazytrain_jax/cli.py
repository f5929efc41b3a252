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
import os
import sys


def _info(args) -> int:
    from lazytrain_jax.model.config import ModelConfig, get_preset

    if os.path.isdir(args.model):
        cfg = ModelConfig.from_json_file(os.path.join(args.model, "config.json"))
    else:
        cfg = get_preset(args.model)
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
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"--set {pair!r}: {value!r} is not a number") from None
    return out


def _plan(args) -> int:
    from lazytrain_jax.model.config import ModelConfig
    from lazytrain_jax.schedule.api import plan
    from lazytrain_jax.schedule.hardware import Hardware

    model = args.model
    if os.path.isdir(model):
        model = ModelConfig.from_json_file(os.path.join(model, "config.json"))
    hardware = Hardware.preset(args.hardware, **_hardware_overrides(args.set))
    result = plan(model, hardware, batch_size=args.batch_size, seq_len=args.seq_len, rel_gap=args.rel_gap,
                  time_limit_s=args.time_limit)
    print(result.explain())
    if args.out:
        result.save(args.out)
        print(f"plan saved to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from lazytrain_jax import __version__

    parser = argparse.ArgumentParser(prog="lazytrain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"lazytrain_jax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{demo,train,eval,profile,export,info,plan,version}")
    from lazytrain_jax.train.commands import register
    register(sub)  # demo, train, eval, profile, export
    info = sub.add_parser("info", help="shape and parameter count of a preset or checkpoint directory")
    info.add_argument("model", help="preset name or Hugging Face checkpoint directory")
    info.set_defaults(func=_info)
    plan = sub.add_parser("plan", help="plan a step (MILP) for a model on a hardware preset")
    plan.add_argument("model", help="preset name or Hugging Face checkpoint directory")
    plan.add_argument("--hardware", default="rtx3090", help="hardware preset (rtx3090, h800, ...)")
    plan.add_argument("--set", action="append", default=[], metavar="FIELD=NUMBER",
                      help="override a hardware field, e.g. --set h2d_bw=12e9 (repeatable)")
    plan.add_argument("--batch-size", type=_batch_size, default="max", help="integer, 'max' or 'best'")
    plan.add_argument("--seq-len", type=int, default=1024)
    plan.add_argument("--rel-gap", type=float, default=1e-2)
    plan.add_argument("--time-limit", type=float, default=30.0, help="CBC seconds per MILP")
    plan.add_argument("--out", help="save the plan as JSON (atomically)")
    plan.set_defaults(func=_plan)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda a: print(f"lazytrain_jax {__version__}") or 0)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    for name in ("batch_size", "seq_len"):
        if isinstance(getattr(args, name, None), int) and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be a positive integer")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"lazytrain: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
