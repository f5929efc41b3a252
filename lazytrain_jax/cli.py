"""The ``lazytrain`` command.

Subcommands:
  demo    build a small random model, print its parameter count and one loss/gradient (no download)
  info    print the shape and parameter count of a preset or a Hugging Face checkpoint directory
  version print the version
"""

from __future__ import annotations

import argparse
import os
import sys


def _demo(args) -> int:
    import jax
    import numpy as np

    import lazytrain_jax as lt

    model = lt.init_model(args.preset, seed=args.seed)
    cfg = model.config
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(0, cfg.vocab_size, (args.batch_size, args.seq_len)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}
    loss, grads = lt.loss_and_grad(model, batch)
    grad_norm = float(np.sqrt(sum(float(np.sum(np.square(g))) for g in jax.tree.leaves(grads))))
    print(f"model      {args.preset} ({cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size})")
    print(f"parameters {model.num_params():,}")
    print(f"batch      {args.batch_size} x {args.seq_len} random tokens")
    print(f"loss       {float(loss):.4f}  (uniform guess: ln(vocab) = {np.log(cfg.vocab_size):.4f})")
    print(f"grad norm  {grad_norm:.4f}")
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    from lazytrain_jax import __version__

    parser = argparse.ArgumentParser(prog="lazytrain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"lazytrain_jax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{demo,info,version}")
    demo = sub.add_parser("demo", help="random debug model: parameter count and one loss")
    demo.add_argument("--preset", default="qwen3-debug")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--batch-size", type=int, default=2)
    demo.add_argument("--seq-len", type=int, default=32)
    demo.set_defaults(func=_demo)
    info = sub.add_parser("info", help="shape and parameter count of a preset or checkpoint directory")
    info.add_argument("model", help="preset name or Hugging Face checkpoint directory")
    info.set_defaults(func=_info)
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
        if getattr(args, name, 1) <= 0:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be a positive integer")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"lazytrain: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
