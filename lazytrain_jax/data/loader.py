"""Seeded shuffling into static-shape batches with a resumable cursor.

Batches are drawn from an endless stream: epoch e visits the rows in the permutation
``default_rng([seed, e])``; a batch that crosses an epoch boundary continues into the next epoch's
order. The cursor (epoch, position) is all the state there is, so a resumed run draws exactly the
batches an uninterrupted one would.
"""

from __future__ import annotations

import numpy as np

from lazytrain_jax.data.encode import EncodedData

BATCH_KEYS = ("input_ids", "attention_mask", "labels")


class BatchLoader:
    """Yields ``{"input_ids", "attention_mask", "labels"}`` int32 ``[batch_size, seq_len]`` batches.

    Args:
      data: EncodedData.
      batch_size: rows per batch.
      seed: the shuffling seed; shuffle=False keeps file order every epoch.

    Example:
      >>> loader = BatchLoader(encoded, batch_size=8, seed=0)
      >>> batch = loader.next_batch()
      >>> state = loader.state_dict()   # {"epoch": 0, "position": 8}
    """

    def __init__(self, data: EncodedData, batch_size: int, *, seed: int = 0, shuffle: bool = True):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
        self.data, self.batch_size, self.seed, self.shuffle = data, batch_size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order_epoch, self._order = None, None

    def __len__(self) -> int:
        """Batches per epoch (rounded up: the last one borrows from the next epoch)."""
        return -(-len(self.data) // self.batch_size)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = len(self.data)
            self._order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order

    def next_indices(self) -> np.ndarray:
        out = []
        while len(out) < self.batch_size:
            order = self._epoch_order(self.epoch)
            take = min(self.batch_size - len(out), len(order) - self.position)
            out.extend(order[self.position:self.position + take])
            self.position += take
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return np.asarray(out)

    def next_batch(self) -> dict[str, np.ndarray]:
        idx = self.next_indices()
        return {k: np.ascontiguousarray(getattr(self.data, k)[idx]) for k in BATCH_KEYS}

    def state_dict(self) -> dict[str, int]:
        return {"epoch": int(self.epoch), "position": int(self.position), "seed": int(self.seed)}

    def load_state_dict(self, state: dict) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"data cursor seed={state['seed']} differs from this loader's seed={self.seed}")
        if not 0 <= int(state["position"]) < max(1, len(self.data)):
            raise ValueError(f"data cursor position={state['position']} is outside the dataset of {len(self.data)} rows")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
