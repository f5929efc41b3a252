"""``lt.train``: a streamed fine-tuning run with exact-match eval, crash-safe checkpoints and metrics."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np

from lazytrain_jax.train import checkpoint as ckpt
from lazytrain_jax.train import metrics as mt
from lazytrain_jax.train.autoplan import auto_plan
from lazytrain_jax.train.schedule import lr_schedule as make_schedule

PAPER_LR, PAPER_WEIGHT_DECAY, PAPER_CLIP = 1e-5, 0.01, 1.0


@dataclasses.dataclass
class TrainResult:
    """What a run produced.

    Attributes:
      model: the trained Model (fp32 master weights); plan: the Plan it ran.
      steps: optimizer steps done in total; start_step: where this call began (> 0 when resumed).
      records: every JSONL record (step metrics and evals), resumed history included.
      summary: medians, peaks and the final exact match (see ``metrics.summarize``).
      eval: the last EvalResult (or None); checkpoint: the last checkpoint's path (or None).
      opt_state: the final optimizer state (numpy leaves).
    """

    model: Any
    plan: Any
    steps: int
    start_step: int
    records: list
    summary: dict
    eval: Any = None
    checkpoint: str | None = None
    log_dir: str | None = None
    opt_state: Any = None


def _resolve_model(model):
    from lazytrain_jax.model.container import Model
    from lazytrain_jax.model.hf_io import load_model

    if isinstance(model, (str, os.PathLike)):
        if not os.path.isdir(model):
            raise ValueError(f"model={os.fspath(model)!r} is not a directory; give a Model or a Hugging Face "
                             f"model directory")
        return load_model(model)
    if not isinstance(model, Model):
        raise ValueError(f"model must be a lazytrain_jax.Model or a Hugging Face directory; got {type(model).__name__}")
    return model


def _encoded(data):
    from lazytrain_jax.data.dataset import Dataset
    from lazytrain_jax.data.encode import EncodedData

    if isinstance(data, Dataset):
        return data.encoded, data.fingerprint()
    if isinstance(data, EncodedData):
        import hashlib
        h = hashlib.sha256(data.input_ids.tobytes() + data.labels.tobytes()).hexdigest()[:16]
        return data, h
    raise ValueError(f"data must be a lazytrain_jax.data.Dataset (load_dataset) or EncodedData; got {type(data).__name__}")


def _describe_optimizer(tx, total_steps: int) -> dict:
    from lazytrain_jax.optim.config import hyperparams_of

    cfg = hyperparams_of(tx)
    if cfg is None:
        return {"kind": "custom optax transform"}
    lr = cfg.learning_rate
    lrs = [float(lr(s)) for s in (0, total_steps // 2, max(0, total_steps - 1))] if callable(lr) else float(lr)
    return {"kind": "adamw_8bit", "learning_rate": lrs, "b1": cfg.b1, "b2": cfg.b2, "eps": cfg.eps,
            "weight_decay": cfg.weight_decay, "max_grad_norm": cfg.max_grad_norm, "state_format": cfg.state_format,
            "block_size": cfg.block_size}


def _compat(cfg, plan, encoded, fingerprint, seed, optimizer_desc, total_steps, stream_dtype) -> dict:
    model = json_safe(dataclasses.asdict(cfg))
    return {"model": model, "plan": {"batch_size": plan.batch_size, "seq_len": plan.seq_len,
                                     "num_micro_batches": plan.num_micro_batches, "stream_dtype": stream_dtype},
            "data": {"rows": len(encoded), "fingerprint": fingerprint, "seed": seed},
            "optimizer": optimizer_desc, "total_steps": total_steps}


def json_safe(x):
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


def _check_positive(name, value, allow_none=True):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def train(model, plan, data, *, optimizer=None, steps: int | None = None, epochs: float | None = None,
          lr_schedule=None, eval_data=None, eval_every: int | None = None, checkpoint_dir: str | None = None,
          checkpoint_every: int | None = None, keep_last: int = 3, log_dir: str | None = None, seed: int = 0,
          resume: bool = True, device_memory: float | None = None, batch_size: int | str | None = None,
          hardware: str = "measured", stream_dtype: str = "bfloat16", offload_dir: str | None = None,
          export_dir: str | None = None, max_new_tokens: int = 256, eval_batch_size: int = 64,
          progress: bool = True, print_fn=print, on_step=None) -> TrainResult:
    """Fine-tunes (or trains) a model layer-streamed under a Plan.

    Args:
      model: a Model, or a Hugging Face model directory.
      plan: a Plan for this model, batch and ``data.seq_len``; or ``"auto"``: profile this machine and
        solve under ``device_memory`` for ``batch_size`` sequences.
      data: a ``lazytrain_jax.data.Dataset`` (``load_dataset``) or ``EncodedData``.
      optimizer: any optax transform; default ``adamw_8bit`` with the paper's recipe (weight decay
        0.01, clip 1.0) and ``lr_schedule``.
      steps / epochs: run length (one of them).
      lr_schedule: peak learning rate (float) or an optax schedule; default: peak 1e-5, linear warm-up
        over 3% of the run, cosine decay to 0. Only with the default optimizer.
      eval_data: a Dataset or a list of Examples for exact-match accuracy (uses ``data``'s tokenizer
        and format); evaluated every ``eval_every`` steps and at the end.
      checkpoint_dir, checkpoint_every, keep_last: crash-safe checkpoints (written in the background;
        always one at the end); ``resume`` continues from the latest one, bit-identically.
      log_dir: ``log.jsonl``, ``summary.json``/``.txt``, ``loss.png``, ``timeline.png``, ``trace.json``.
      seed: data shuffling seed.
      device_memory, batch_size, hardware: for ``plan="auto"`` (device_memory required on the CPU
        backend; hardware ``"measured"`` or a preset name; with ``"measured"`` batch_size may be
        ``"max"``, the largest batch that fits, or ``"best"``, the most tokens/s).
      stream_dtype, offload_dir: passed to the StreamingEngine.
      export_dir: save the final weights (and the tokenizer) as a Hugging Face directory.
      max_new_tokens, eval_batch_size: generation settings of the eval. The eval generates resident
        when the weights, KV cache and working set fit the plan's device budget, else layer-streamed
        over the whole eval batch (``lazytrain_jax.executor.generate.choose_decoder``).
      progress: show a tqdm bar; print_fn: where plan and summary lines go (None: silent).
      on_step: called as ``on_step(record)`` after every step with its JSONL record.

    Returns:
      TrainResult.

    Example:
      >>> ds = lt.data.load_dataset("train.jsonl", "model_dir", seq_len=512)
      >>> result = lt.train("model_dir", "auto", ds, steps=100, batch_size=8, device_memory=20e9)
    """
    from lazytrain_jax.executor import StreamingEngine
    from lazytrain_jax.model.container import Model
    from lazytrain_jax.schedule.plan import Plan
    import lazytrain_jax.optim as optim

    say = print_fn or (lambda *a, **k: None)
    model = _resolve_model(model)
    cfg = model.config
    encoded, data_fingerprint = _encoded(data)
    for name, value in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every), ("keep_last", keep_last)):
        _check_positive(name, value)
    # an interval with nothing to do it on is a mistake, not a no-op
    if eval_every is not None and eval_data is None:
        raise ValueError(f"eval_every={eval_every} needs eval_data (held-out examples to evaluate)")
    if checkpoint_every is not None and not checkpoint_dir:
        raise ValueError(f"checkpoint_every={checkpoint_every} needs checkpoint_dir")
    if isinstance(plan, str) and plan == "auto":
        if batch_size is None:
            raise ValueError("plan='auto' needs batch_size (sequences per step)")
        plan = auto_plan(model, batch_size=batch_size, seq_len=encoded.seq_len, device_memory=device_memory,
                         hardware=hardware, stream_dtype=stream_dtype, offload_dir=offload_dir)
    elif isinstance(plan, (str, os.PathLike)):
        plan = Plan.load(os.fspath(plan), model=model)
    if not isinstance(plan, Plan):
        raise ValueError(f"plan must be a Plan, 'auto' or a plan JSON path; got {plan!r:.80}")
    if plan.seq_len != encoded.seq_len:
        raise ValueError(f"plan.seq_len={plan.seq_len} differs from the data's seq_len={encoded.seq_len}: "
                         f"plan for the data's sequence length")
    if batch_size is not None and not isinstance(batch_size, str) and batch_size != plan.batch_size:
        raise ValueError(f"batch_size={batch_size} differs from plan.batch_size={plan.batch_size}")
    if (steps is None) == (epochs is None):
        raise ValueError(f"give exactly one of steps={steps!r} and epochs={epochs!r}")
    if epochs is not None:
        if not epochs > 0:
            raise ValueError(f"epochs={epochs!r} must be > 0")
        steps = max(1, math.ceil(epochs * len(encoded) / plan.batch_size))
    _check_positive("steps", steps, allow_none=False)
    if optimizer is None:
        sched = lr_schedule if callable(lr_schedule) else make_schedule(
            PAPER_LR if lr_schedule is None else float(lr_schedule), steps)
        optimizer = optim.adamw_8bit(learning_rate=sched, weight_decay=PAPER_WEIGHT_DECAY, max_grad_norm=PAPER_CLIP)
    elif lr_schedule is not None:
        raise ValueError("lr_schedule applies to the default optimizer only; put the schedule in your optimizer")
    else:
        sched = None
    optimizer_desc = _describe_optimizer(optimizer, steps)
    compat = _compat(cfg, plan, encoded, data_fingerprint, seed, optimizer_desc, steps, stream_dtype)
    eval_examples = None
    if eval_data is not None:
        eval_examples = list(getattr(eval_data, "examples", eval_data))
        if not hasattr(data, "tokenizer"):
            raise ValueError("eval_data needs a tokenizer: pass data as a Dataset (lazytrain_jax.data.load_dataset)")

    from lazytrain_jax.data.loader import BatchLoader
    loader = BatchLoader(encoded, plan.batch_size, seed=seed)
    manager = ckpt.CheckpointManager(checkpoint_dir, keep_last=keep_last) if checkpoint_dir else None
    engine = StreamingEngine(model, plan, optimizer, stream_dtype=stream_dtype, offload_dir=offload_dir)
    start_step, last_ckpt, result_eval = 0, None, None
    log = None
    try:
        if manager is not None and resume and (latest := manager.latest()) is not None:
            meta = ckpt.read_meta(latest)
            diffs = ckpt.compare(compat, meta["compat"])
            if diffs:
                raise ckpt.CheckpointError(
                    f"checkpoint {latest} does not belong to this run: " + "; ".join(diffs[:8])
                    + ". Use another checkpoint_dir, or resume=False to start over")
            engine.load_state_dict(ckpt.read_state(latest, engine.state_dict()))
            loader.load_state_dict(meta["data_cursor"])
            start_step, last_ckpt = int(meta["step"]), latest
            say(f"resumed from {latest} (step {start_step})")
        log = mt.MetricsLog(log_dir, start_step=start_step)
        flops = mt.step_flops(cfg, plan)
        peak = mt.device_peak_flops()
        tokens_per_step = plan.batch_size * plan.seq_len
        bar = mt.progress_bar(steps, start_step, progress and start_step < steps)

        def run_eval(step):
            params_model = Model(cfg, engine.params)
            from lazytrain_jax.data.evaluate import exact_match
            res = exact_match(params_model, eval_examples, data.tokenizer, fmt=data.fmt,
                              max_new_tokens=max_new_tokens, batch_size=eval_batch_size,
                              device_memory=plan.hardware.device_memory - plan.hardware.device_margin)
            log.write({"event": "eval", "step": step, **res.to_dict()})
            return res

        def save(step):
            state = engine.state_dict()
            meta = {"compat": compat, "data_cursor": loader.state_dict(), "rng": {"shuffle_seed": seed,
                                                                                   "epoch": loader.epoch}}
            manager.save(step, state, meta, plan.to_json())
            return os.path.join(manager.directory, f"step_{step:08d}")

        for step in range(start_step + 1, steps + 1):
            m = engine.step(loader.next_batch())
            lr = float(sched(step - 1)) if sched is not None else float("nan")
            rec = mt.step_record(step, m, lr=lr, flops=flops, peak=peak, tokens_per_step=tokens_per_step)
            log.write(rec)
            if on_step is not None:
                on_step(rec)
            if bar is not None:
                bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}", refresh=False)
                bar.update(1)
            if manager is not None and checkpoint_every and step % checkpoint_every == 0 and step < steps:
                last_ckpt = save(step)
            if eval_examples is not None and eval_every and step % eval_every == 0 and step < steps:
                res = run_eval(step)
                if bar is not None:
                    bar.write(f"step {step}: exact match {100 * res.accuracy:.1f} % ({res.num_correct}/{res.num_total})")
        if bar is not None:
            bar.close()
        if manager is not None and start_step < steps:
            last_ckpt = save(steps)
        if eval_examples is not None:
            result_eval = run_eval(steps)
        final = Model(cfg, engine.params)
        if manager is not None:
            manager.close()
        if log_dir:
            timeline = engine.timeline
            measured = timeline.to_dicts() if hasattr(timeline, "to_dicts") else [dict(iv) for iv in timeline]
            if measured:
                engine.save_trace(os.path.join(log_dir, "trace.json"))
                from lazytrain_jax.schedule.simulator import simulate
                mt.save_timeline_png(measured, simulate(plan), os.path.join(log_dir, "timeline.png"))
            mt.save_loss_png(log.records, os.path.join(log_dir, "loss.png"))
        summary = mt.summarize(log.records)
        if log_dir:
            mt.write_summary(log_dir, summary)
        if export_dir:
            from lazytrain_jax.model.hf_io import save_hf
            save_hf(final, export_dir)
            if hasattr(data, "tokenizer"):
                data.tokenizer.save_pretrained(export_dir)
        return TrainResult(model=final, plan=plan, steps=steps, start_step=start_step, records=list(log.records),
                           summary=summary, eval=result_eval, checkpoint=last_ckpt, log_dir=log_dir,
                           opt_state=engine.opt_state)
    finally:
        engine.close()
        if log is not None:
            log.close()
        if manager is not None and manager._thread is not None:
            manager._thread.join()
