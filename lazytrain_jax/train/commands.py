"""The ``lazytrain`` training subcommands: ``train``, ``eval``, ``profile``, ``export``, ``demo``.

A thin layer over the library: each parses its arguments, calls it, and turns a bad input into one
clear line on stderr and exit status 1 (``register`` adds them to the top-level parser).
"""

from __future__ import annotations

import argparse
import os
import sys

from lazytrain_jax.train.config import TrainConfig, keys_help

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, RuntimeError, OSError)


def _fail(e: BaseException) -> int:
    print(f"lazytrain: error: {e}", file=sys.stderr)
    return 1


def guarded(fn):
    """Runs a subcommand; a user error becomes a message and exit status 1."""
    def run(args) -> int:
        try:
            return fn(args)
        except USER_ERRORS as e:
            return _fail(e)
    return run


def build_model(section):
    import lazytrain_jax as lt

    if (section.path is None) == (section.preset is None):
        raise ValueError(f"give exactly one of model.path={section.path!r} and model.preset={section.preset!r}")
    if section.path is not None:
        if section.overrides:
            raise ValueError("model.overrides applies to model.preset only")
        return lt.load_model(section.path)
    from lazytrain_jax.model.config import ModelConfig
    import dataclasses
    import difflib
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for key in section.overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            raise ValueError(f"unknown config key 'model.overrides.{key}'"
                             + (f"; did you mean {close[0]!r}?" if close else f"; valid: {sorted(fields)}"))
    return lt.init_model(lt.get_preset(section.preset, **section.overrides), seed=section.init_seed)


def run_config(cfg: TrainConfig, *, print_fn=print):
    """Runs ``lt.train`` as a TrainConfig describes. Returns the TrainResult."""
    from lazytrain_jax.data import PromptFormat, load_dataset, load_tokenizer
    from lazytrain_jax.train.loop import train
    from lazytrain_jax.schedule.plan import Plan
    from lazytrain_jax.train.schedule import lr_schedule
    import lazytrain_jax.optim as optim

    d, o, p, t = cfg.data, cfg.optim, cfg.plan, cfg.train
    if d.train_file is None:
        raise ValueError("data.train_file is required (a MetaMathQA-format JSONL file)")
    # an interval with nothing to do it on is a mistake in the config, not a no-op
    if t.eval_every is not None and not d.eval_file:
        raise ValueError(f"train.eval_every={t.eval_every} needs data.eval_file (held-out examples to evaluate)")
    if t.checkpoint_every is not None and not t.checkpoint_dir:
        raise ValueError(f"train.checkpoint_every={t.checkpoint_every} needs train.checkpoint_dir")
    tok_dir = d.tokenizer or cfg.model.path
    if tok_dir is None:
        raise ValueError("data.tokenizer is required when the model is a preset (no model directory to read it from)")
    tokenizer = load_tokenizer(tok_dir)
    fmt = PromptFormat(template=d.template, plain_prompt=d.plain_prompt)
    train_set = load_dataset(d.train_file, tokenizer, d.seq_len, fmt=fmt, skip_bad_lines=d.skip_bad_lines)
    print_fn(f"data       {train_set.source}: {len(train_set)} examples ({train_set.num_skipped} bad lines skipped, "
             f"{train_set.encoded.num_truncated} truncated, {train_set.encoded.num_dropped} dropped)")
    eval_set = None
    if d.eval_file:
        eval_set = load_dataset(d.eval_file, tokenizer, d.seq_len, fmt=fmt, skip_bad_lines=d.skip_bad_lines).examples
        eval_set = list(eval_set)[:d.num_eval] if d.num_eval else list(eval_set)
    model = build_model(cfg.model)
    if (t.steps is None) == (t.epochs is None):
        raise ValueError(f"give exactly one of train.steps={t.steps!r} and train.epochs={t.epochs!r}")
    plan = p.plan
    if plan == "auto":
        from lazytrain_jax.train.autoplan import auto_plan
        plan = auto_plan(model, batch_size=p.batch_size, seq_len=d.seq_len, device_memory=p.device_memory,
                         hardware=p.hardware, stream_dtype=p.stream_dtype, offload_dir=p.offload_dir,
                         num_micro_batches=p.num_micro_batches)
    elif os.path.isfile(plan):
        plan = Plan.load(plan, model=model)
    else:
        raise ValueError(f"plan.plan={plan!r} is neither 'auto' nor a plan JSON file")
    # the plan's batch (a plan file's own, or the one "max" / "best" chose) sets the steps of an epoch
    steps = t.steps or max(1, -(-int(t.epochs * len(train_set)) // plan.batch_size))
    sched = lr_schedule(o.learning_rate, steps, warmup_steps=o.warmup_steps, kind=o.schedule, min_lr_ratio=o.min_lr_ratio)
    tx = optim.adamw_8bit(learning_rate=sched, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                          max_grad_norm=o.max_grad_norm, state_format=o.state_format)
    if print_fn:
        print_fn(plan.explain())
    return train(model, plan, train_set, optimizer=tx, steps=steps, eval_data=eval_set, eval_every=t.eval_every,
                 checkpoint_dir=t.checkpoint_dir, checkpoint_every=t.checkpoint_every, keep_last=t.keep_last,
                 log_dir=t.log_dir, seed=t.seed, resume=t.resume, stream_dtype=p.stream_dtype,
                 offload_dir=p.offload_dir, export_dir=t.export_dir, max_new_tokens=d.max_new_tokens,
                 eval_batch_size=d.eval_batch_size, progress=t.progress, print_fn=print_fn)


def _train(args) -> int:
    from lazytrain_jax.train.metrics import summary_table

    cfg = TrainConfig.load(args.config, args.set)
    result = run_config(cfg)
    print(summary_table(result.summary))
    return 0


def _eval(args) -> int:
    import lazytrain_jax as lt
    from lazytrain_jax.data import PromptFormat, exact_match, load_tokenizer, read_jsonl

    model = lt.load_model(args.model)
    tok = load_tokenizer(args.tokenizer or args.model)
    examples = list(read_jsonl(args.data, skip_bad_lines=args.skip_bad_lines).examples)[:args.num or None]
    fmt = PromptFormat(template=args.template, **({"plain_prompt": args.plain_prompt} if args.plain_prompt else {}))
    device_memory = args.device_memory
    if device_memory is None and jax_platform() != "cpu":
        from lazytrain_jax.train.autoplan import device_memory_default
        device_memory = device_memory_default()
    res = exact_match(model, examples, tok, fmt=fmt, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                      device_memory=device_memory)
    print(f"generation: {res.decoder}")
    for query, text, ref in res.samples:
        print(f"  {query!r} -> {text!r} (reference {ref})")
    print(f"exact match {100 * res.accuracy:.1f} % ({res.num_correct}/{res.num_total}) in {res.seconds:.1f} s")
    return 0


def jax_platform() -> str:
    import jax
    return jax.devices()[0].platform


def _profile(args) -> int:
    import lazytrain_jax as lt
    from lazytrain_jax.atomic import check_writable_file_path

    if args.out:
        check_writable_file_path(args.out)   # before profiling, not after
    model = lt.load_model(args.model) if os.path.isdir(args.model) else lt.init_model(args.model)
    costs, hw = lt.profile(model, args.batch_size, args.seq_len, num_micro_batches=args.num_micro_batches,
                           stream_dtype=args.stream_dtype, offload_dir=args.offload_dir,
                           device_memory=args.device_memory)
    for key, value in costs.summary().items():
        print(f"{key:<24} {value}")
    for key, value in hw.to_dict().items():
        print(f"hardware.{key:<20} {value}")
    if args.out:
        from lazytrain_jax.atomic import atomic_write_text
        import json
        atomic_write_text(args.out, json.dumps({"costs": costs.to_dict(), "hardware": hw.to_dict()}, indent=1))
        print(f"saved to {args.out}")
    return 0


def _export(args) -> int:
    from lazytrain_jax.train.export import export_checkpoint

    path = export_checkpoint(args.checkpoint, args.out, tokenizer=args.tokenizer)
    print(f"exported {path}")
    return 0


def _demo(args) -> int:
    from lazytrain_jax.atomic import unwritable_directory
    from lazytrain_jax.train.demo import run_demo

    if (why := unwritable_directory(args.out)) is not None:   # named as the command's option
        raise ValueError(f"--out {args.out}: not a writable directory ({why})")
    return run_demo(out_dir=args.out, steps=args.steps, seed=args.seed, num_eval=args.num_eval,
                    batch_size=args.batch_size, seq_len=args.seq_len, progress=not args.no_progress,
                    eval_every=args.eval_every)


class _HelpFormat(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the config-key listing's line breaks and shows every option's default."""


def register(sub) -> None:
    """Adds train / eval / profile / export / demo to the ``lazytrain`` subparsers."""
    from lazytrain_jax.cli import _int_at_least, _number
    from lazytrain_jax.train.demo import DEMO_BATCH, DEMO_SEQ, DEMO_STEPS

    fmt = _HelpFormat
    demo = sub.add_parser("demo", formatter_class=fmt,
                          help="train a tiny Qwen3 from scratch on 2-digit +/- (streamed, offloaded); report exact match")
    demo.add_argument("--out", default="lazytrain-demo", help="directory for the log, PNGs and HF checkpoint")
    demo.add_argument("--steps", type=_int_at_least("--steps", 1), default=DEMO_STEPS, help="training steps")
    demo.add_argument("--batch-size", type=_int_at_least("--batch-size", 1), default=DEMO_BATCH,
                      help="sequences per step")
    demo.add_argument("--seq-len", type=_int_at_least("--seq-len", 2), default=DEMO_SEQ,
                      help=f"tokens per sequence ({DEMO_SEQ} holds every problem with its working)")
    demo.add_argument("--num-eval", type=_int_at_least("--num-eval", 1), default=256, help="held-out problems")
    demo.add_argument("--seed", type=_int_at_least("--seed", 0), default=0, help="data split, shuffle and init seed")
    demo.add_argument("--eval-every", type=_int_at_least("--eval-every", 1), default=None,
                      help="also evaluate every N steps")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=guarded(_demo))
    train = sub.add_parser("train", help="train from a YAML/JSON config", formatter_class=fmt,
                           description="Train as CONFIG describes. Config keys (section.key):\n\n" + keys_help())
    train.add_argument("config", help="YAML or JSON config file")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set train.steps=100 (repeatable)")
    train.set_defaults(func=guarded(_train))
    ev = sub.add_parser("eval", formatter_class=fmt,
                        help="exact-match accuracy of a Hugging Face model directory on a JSONL file")
    ev.add_argument("model", help="Hugging Face model directory")
    ev.add_argument("data", help="MetaMathQA-format JSONL")
    ev.add_argument("--tokenizer", help="tokenizer directory (default: the model directory)")
    ev.add_argument("--num", type=_int_at_least("--num", 0), default=0, help="first N examples (0: all)")
    ev.add_argument("--max-new-tokens", type=_int_at_least("--max-new-tokens", 1), default=256,
                    help="generation budget per example")
    ev.add_argument("--batch-size", type=_int_at_least("--batch-size", 1), default=64, help="prompts per batch")
    ev.add_argument("--template", default="auto", help="auto | chat | plain")
    ev.add_argument("--plain-prompt", default=None,
                    help="the plain prompt template with {query}; None means 'Question: {query}\\nAnswer: '")
    ev.add_argument("--skip-bad-lines", action="store_true", help="skip malformed JSONL lines (counted)")
    ev.add_argument("--device-memory", type=_number("--device-memory", 0.0, None, True), default=None,
                    help="device bytes generation may use; when the model, KV cache and working set do not fit, "
                         "the layers are streamed over each batch (default: the accelerator's free memory; "
                         "no limit on the CPU backend)")
    ev.set_defaults(func=guarded(_eval))
    prof = sub.add_parser("profile", formatter_class=fmt, help="measure unit costs and this machine's rates (lt.profile)")
    prof.add_argument("model", help="preset name or Hugging Face model directory")
    prof.add_argument("--batch-size", type=_int_at_least("--batch-size", 1), default=1, help="sequences per step")
    prof.add_argument("--seq-len", type=_int_at_least("--seq-len", 1), default=512, help="tokens per sequence")
    prof.add_argument("--num-micro-batches", type=_int_at_least("--num-micro-batches", 1), default=1,
                      help="layer-major micro-batches per step")
    prof.add_argument("--stream-dtype", default="bfloat16", help="dtype of streamed weights and activations")
    prof.add_argument("--offload-dir", help="directory whose NVMe bandwidth is measured")
    prof.add_argument("--device-memory", type=float, help="device bytes (required on the CPU backend)")
    prof.add_argument("--out", help="save costs and hardware as JSON")
    prof.set_defaults(func=guarded(_profile))
    exp = sub.add_parser("export", formatter_class=fmt, help="write a training checkpoint's weights as a Hugging Face directory")
    exp.add_argument("checkpoint", help="a checkpoint directory (step_XXXXXXXX) or a checkpoint_dir (latest)")
    exp.add_argument("out", help="output Hugging Face directory")
    exp.add_argument("--tokenizer", help="tokenizer directory to copy alongside")
    exp.set_defaults(func=guarded(_export))
