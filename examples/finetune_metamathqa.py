"""Fine-tune a Hugging Face model on MetaMathQA-format data on one accelerator, the paper's recipe.

AdamW (hybrid 8-bit state), learning rate 1e-5 with linear warm-up and cosine decay, weight decay
0.01, gradient clipping 1.0; an auto plan for this machine under its free device memory; exact match
on held-out problems before and after; the result exported as a Hugging Face directory.

    python examples/finetune_metamathqa.py --model path/to/hf_model --data MetaMathQA-395K.jsonl \\
        --eval-data gsm8k_test.jsonl --out finetuned --steps 1000 --batch-size 8 --seq-len 1024

On the CPU backend give --device-memory (device and host share one memory).
"""

from __future__ import annotations

import argparse
import os
import sys

import lazytrain_jax as lt
from lazytrain_jax.data import exact_match, load_dataset, load_tokenizer, read_jsonl


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory (weights + tokenizer)")
    p.add_argument("--data", required=True, help="MetaMathQA-format JSONL for training")
    p.add_argument("--eval-data", help="held-out JSONL for exact match")
    p.add_argument("--tokenizer", help="tokenizer directory (default: --model)")
    p.add_argument("--out", required=True, help="where the log, checkpoints and the exported model go")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-5, help="peak learning rate (paper: 1e-5)")
    p.add_argument("--device-memory", type=float, help="device bytes for the plan (default: free memory)")
    p.add_argument("--num-eval", type=int, default=0, help="first N eval examples (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--checkpoint-every", type=int, default=100)
    args = p.parse_args(argv)

    tokenizer = load_tokenizer(args.tokenizer or args.model)
    train_set = load_dataset(args.data, tokenizer, args.seq_len, skip_bad_lines=True)
    print(f"{len(train_set)} training examples ({train_set.num_skipped} bad lines skipped, "
          f"{train_set.encoded.num_truncated} truncated to {args.seq_len} tokens)")
    held_out = None
    model = lt.load_model(args.model)
    if args.eval_data:
        held_out = list(read_jsonl(args.eval_data, skip_bad_lines=True).examples)[:args.num_eval or None]
        before = exact_match(model, held_out, tokenizer, fmt=train_set.fmt, max_new_tokens=args.max_new_tokens)
        print(f"exact match before: {100 * before.accuracy:.1f} % ({before.num_correct}/{before.num_total})")
    result = lt.train(model, "auto", train_set, steps=args.steps, batch_size=args.batch_size,
                      device_memory=args.device_memory, lr_schedule=args.lr, eval_data=held_out,
                      checkpoint_dir=os.path.join(args.out, "checkpoints"), checkpoint_every=args.checkpoint_every,
                      log_dir=os.path.join(args.out, "log"), export_dir=os.path.join(args.out, "hf"),
                      max_new_tokens=args.max_new_tokens)
    print(result.plan.explain())
    if result.eval is not None:
        print(f"exact match after: {100 * result.eval.accuracy:.1f} % ({result.eval.num_correct}/{result.eval.num_total})")
    print(f"exported {os.path.join(args.out, 'hf')}")
    return 0


if __name__ == "__main__":
    from lazytrain_jax.host_alloc import reexec_with_huge_pages
    reexec_with_huge_pages()  # huge pages for glibc's large host blocks (the embedding table, gradients)
    sys.exit(main())
