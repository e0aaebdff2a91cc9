"""The built-in ``numpy`` model: an LSTM-shaped recurrence in numpy, with no TensorFlow.

A stand-in workload for host acceptance where TensorFlow is absent (``hftagent probe --model
numpy``, ``hftagent gate --model numpy``, ``hftagent watch --probe numpy``): per step one
[1, features+hidden] × [features+hidden, 4·hidden] float32 product (a BLAS sgemv at batch 1),
a bias add, tanh for the gates and the cell update — the arithmetic shape of the built-in
LSTM's recurrence, so its latency is of the same order (~0.3-1 ms on a 2-core VM). It is not
a TensorFlow model and its figures are not a TensorFlow measurement: it shows what the host
does to a CPU-bound, allocation-free call of that size, nothing about TF's runtime.

Weights come from a fixed seed; nothing is cached or downloaded. This module imports numpy
only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

SEED = 20240611
STEPS, FEATURES, HIDDEN = 64, 32, 128
DESCRIPTION = (f"numpy LSTM-shaped recurrence [1,{STEPS},{FEATURES}] → {HIDDEN} "
               "(stand-in, no TensorFlow)")


class NumpyLSTM:
    """Fixed-seed weights and the timed callable. ``sample`` ([steps, features]) is drawn
    first from the seed, then the weights: the watch probe's input and weights, unchanged."""

    def __init__(self, steps: int = STEPS, features: int = FEATURES, hidden: int = HIDDEN,
                 seed: int = SEED) -> None:
        rng = np.random.default_rng(seed)
        self.steps, self.features, self.hidden = steps, features, hidden
        self.sample = rng.standard_normal((steps, features)).astype(np.float32)
        self.w = (rng.standard_normal((features + hidden, 4 * hidden)) * 0.05
                  ).astype(np.float32)
        self.b = np.zeros(4 * hidden, dtype=np.float32)

    @property
    def input_shape(self) -> tuple[int | None, ...]:
        return (None, self.steps, self.features)

    def bind(self, x: np.ndarray) -> Callable[[], np.ndarray]:
        """The zero-argument callable for input ``x`` ([B, steps, features] or [steps,
        features] for one sample); buffers are allocated here, once, outside the timed call.
        Returns the hidden state ([hidden] at batch 1, [B, hidden] above; a view of a buffer
        the next call overwrites)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim == 3 and x.shape[0] == 1:
            x = x[0]
        if x.ndim == 2:
            if x.shape != (self.steps, self.features):
                raise ValueError(f"input {list(x.shape)}; the numpy model takes "
                                 f"[{self.steps},{self.features}]")
            return self._bind_one(x)
        if x.ndim != 3 or x.shape[1:] != (self.steps, self.features):
            raise ValueError(f"input {list(x.shape)}; the numpy model takes "
                             f"[B,{self.steps},{self.features}]")
        return self._bind_batch(x)

    def _bind_one(self, x: np.ndarray) -> Callable[[], np.ndarray]:
        steps, features, hidden = self.steps, self.features, self.hidden
        w, b = self.w, self.b
        xh = np.zeros(features + hidden, dtype=np.float32)
        z = np.empty(4 * hidden, dtype=np.float32)

        def fn() -> np.ndarray:
            c = np.zeros(hidden, dtype=np.float32)
            xh[features:] = 0.0
            for t in range(steps):
                xh[:features] = x[t]
                np.dot(xh, w, out=z)
                np.add(z, b, out=z)
                np.tanh(z, out=z)  # tanh as a cheap stand-in for the sigmoid/tanh gates
                c *= z[:hidden]
                c += z[hidden:2 * hidden] * z[2 * hidden:3 * hidden]
                np.multiply(z[3 * hidden:], np.tanh(c), out=xh[features:])
            return xh[features:]
        return fn

    def _bind_batch(self, x: np.ndarray) -> Callable[[], np.ndarray]:
        steps, features, hidden = self.steps, self.features, self.hidden
        w, b = self.w, self.b
        n = x.shape[0]
        xh = np.zeros((n, features + hidden), dtype=np.float32)
        z = np.empty((n, 4 * hidden), dtype=np.float32)

        def fn() -> np.ndarray:
            c = np.zeros((n, hidden), dtype=np.float32)
            xh[:, features:] = 0.0
            for t in range(steps):
                xh[:, :features] = x[:, t]
                np.dot(xh, w, out=z)
                np.add(z, b, out=z)
                np.tanh(z, out=z)
                c *= z[:, :hidden]
                c += z[:, hidden:2 * hidden] * z[:, 2 * hidden:3 * hidden]
                np.multiply(z[:, 3 * hidden:], np.tanh(c), out=xh[:, features:])
            return xh[:, features:]
        return fn

    def predict(self, xs: np.ndarray) -> np.ndarray:
        """Hidden states [N, hidden] for samples ``xs`` [N, steps, features], one at a time
        (the batch-1 path that is timed)."""
        return np.stack([self.bind(xs[i])().copy() for i in range(xs.shape[0])])
