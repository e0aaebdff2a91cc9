"""bench/service.py's serving loop with a small jitted JAX model on a GPU: the service the
GPU faults of bench/faults/kit.py act on (issue #36), counted and recorded as bench/service.py's.

    .venv/bin/python bench/gpu_service.py --cpu 3 --rate 500 --seconds 60 [--platform cpu]

The model: ``LAYERS`` dense layers with tanh over [batch, ``--width``], reduced over the batch
to one [width] vector (a small MLP: one inference is a handful of kernels). A call takes a
host (numpy) input of [1, width] and returns a host array: one host-to-device copy, the
kernel launches and one device-to-host copy; JAX dispatches asynchronously and the copy back
waits for the GPU (shared/notes/gpu-attach.md: the caller blocks until XLA's host callback
says the stream is done). JAX is imported when the model is built, never at import; its
device memory is not preallocated (``XLA_PYTHON_CLIENT_PREALLOCATE=false``), so a second
process (kit.gpu_other_process) can run kernels on the same GPU.

Its own switches, on the control FIFO beside bench/service.py's (lock, pipe, sleep, idle):

=====================  ========================================================================
``kernel PER_S``       PER_S calls a second (at random) run the model on the big input instead:
                       [``--big-batch``, width], resident on the device (no bigger copy), so
                       its kernels run longer (compiled at start-up; by default the fewest
                       rows whose call takes ``--big-ms``, 3 ms). Count: ``big_inputs``.
``copy PER_S``         PER_S calls a second also copy ``--copy-mb`` MiB from the device to
                       pageable host memory (a fresh result each time: JAX caches an array's
                       host copy). Count: ``big_copies``.
=====================  ========================================================================

Bad input — no JAX, no GPU for it (``--platform gpu``), a bad size — is one line on stderr,
``{"error": ...}`` on stdout and exit 2, as bench/service.py. ``--platform cpu`` runs the same
model on JAX's CPU backend (the loop and its switches where there is no GPU; the GPU faults
need one). :class:`GpuService` is the bench's handle.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import service  # noqa: E402

LAYERS = 4
GPU_KINDS = ("kernel", "copy")
# the platform names JAX_PLATFORMS takes (jax's xla_bridge): "cuda" is NVIDIA's plugin
PLATFORMS = {"gpu": "cuda", "cpu": "cpu"}


class GpuControl(service.Control):
    """bench/service.py's control FIFO with the GPU switches (``kernel``, ``copy``)."""

    KINDS = service.KINDS + GPU_KINDS

    def on(self, kind: str, args: list[str]) -> dict:
        if kind not in GPU_KINDS:
            return super().on(kind, args)
        if len(args) != 1:
            raise ValueError(f"usage: {kind} PER_S | {kind} off")
        per_s = service._number(args[0], "PER_S", 0.01, 100)
        self.sw.next_ns[kind] = 0
        self.sw.gpu[kind] = per_s
        return {}

    def off(self, kind: str) -> None:
        if kind in GPU_KINDS:
            self.sw.gpu[kind] = 0.0
        else:
            super().off(kind)


def _import_jax(platform: str):
    """jax, on ``platform`` ("gpu" or "cpu"), and its first device; ValueError with one
    line when JAX is missing or has no such device."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ["JAX_PLATFORMS"] = PLATFORMS[platform]
    try:
        import jax
    except ImportError as exc:
        raise ValueError(f"no JAX ({exc}): pip install jax (for a GPU: 'jax[cuda12]')"
                         ) from None
    try:
        dev = jax.devices()[0]
    except Exception as exc:  # noqa: BLE001 - the backend did not start: no GPU, no driver
        # (RuntimeError "Unable to initialize backend"; a bare AssertionError where the CUDA
        # plugin is not installed at all, jax 0.10)
        msg = str(exc).strip().splitlines()
        raise ValueError(f"no {platform} for JAX ({msg[0] if msg else type(exc).__name__})"
                         ) from None
    return jax, dev


def build_jax_model(args: argparse.Namespace, sw: service.Switches):
    """(callable, description) of the service's call: the small model on a host input, or
    (switches) on the big device-resident input, and the big copy back. Every shape is
    compiled and run once here, so no call compiles."""
    jax, dev = _import_jax(args.platform)
    import jax.numpy as jnp
    import numpy as np
    w = args.width
    rng = np.random.default_rng(1)
    ws = [jax.device_put((rng.standard_normal((w, w)) / np.sqrt(w)).astype(np.float32), dev)
          for _ in range(LAYERS)]

    @jax.jit
    def model(x, ws):
        for m in ws:
            x = jnp.tanh(x @ m)
        return x.mean(axis=0)

    @jax.jit
    def big_result(x, base):
        return base + x[0, 0]  # one elementwise kernel: the copy of its result is the cost

    x = rng.standard_normal((1, w)).astype(np.float32)
    np.asarray(model(x, ws))
    x_big, rows, big_ms = _big_input(jax, lambda a: np.asarray(model(a, ws)), w, args)
    base = jax.device_put(np.zeros(args.copy_mb << 18, np.float32), dev)  # MiB of float32
    np.asarray(big_result(x, base))
    sw.gpu = dict.fromkeys(GPU_KINDS, 0.0)
    sw.counts.update(big_inputs=0, big_copies=0)
    clock, due, counts, gpu = time.monotonic_ns, sw.due, sw.counts, sw.gpu

    def call() -> None:
        now = clock()
        if gpu["kernel"] and due("kernel", gpu["kernel"], now):
            np.asarray(model(x_big, ws))
            counts["big_inputs"] += 1
        else:
            np.asarray(model(x, ws))
        if gpu["copy"] and due("copy", gpu["copy"], now):
            np.asarray(big_result(x, base))
            counts["big_copies"] += 1
    call.weights = None  # type: ignore[attr-defined]
    return call, (f"jax mlp {LAYERS}x[1,{w}] on {dev.platform}:{dev.id} (big input "
                  f"[{rows},{w}] {big_ms:.1f} ms, copy {args.copy_mb} MiB)")


MAX_ROWS = 1 << 20


def _big_input(jax, run, w: int, args: argparse.Namespace):
    """(the big input on the device, its rows, ms of a call on it): ``--big-batch`` rows, or
    (0) the fewest rows, doubling from 4,096, whose call takes ``--big-ms`` (the median of 3;
    at most :data:`MAX_ROWS`): a kernel long enough to make a spike on any GPU (a fixed
    16,384 × 512 input is ~34 GFLOP over the 4 layers: by arithmetic, not measured, ~0.1 ms at
    an H200's TF32 rate, under a call's P50). Drawn on the device
    (jax.random): no host array of that size, no copy; each size compiled once here."""
    import jax.numpy as jnp
    rows = args.big_batch or 4096
    while True:
        x_big = jax.random.normal(jax.random.key(2), (rows, w), jnp.float32)
        run(x_big)  # compiles this shape
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            run(x_big)
            times.append(time.perf_counter() - t0)
        ms = sorted(times)[1] * 1e3
        if args.big_batch or ms >= args.big_ms or rows >= MAX_ROWS:
            return x_big, rows, ms
        del x_big
        rows *= 2


def _build(args: argparse.Namespace, sw: service.Switches):
    for name, v, lo, hi in (("--width", args.width, 1, 16384),
                            ("--big-batch", args.big_batch, 0, MAX_ROWS),
                            ("--copy-mb", args.copy_mb, 1, 16384),
                            ("--big-ms", args.big_ms, 0.01, 1000)):
        if not lo <= v <= hi:
            raise ValueError(f"{name} must be in {lo:g}..{hi:g}, not {v:g}")
    try:
        return build_jax_model(args, sw)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - XLA's errors (out of memory...), as one line
        msg = str(exc).strip().splitlines()
        raise ValueError(f"the JAX model cannot be built: {msg[0] if msg else type(exc).__name__}"
                         ) from None


class GpuService(service.Service):
    """A running bench/gpu_service.py (bench/service.py's :class:`~bench.service.Service`
    handle: ``pid``, ``tid``, ``ring``, ``dir``, ``info``, ``command``, ``stop``)."""

    SCRIPT = Path(__file__).resolve()

    def __init__(self, cpu: int | None = None, rate: float = 500.0, seconds: float = 600.0,
                 platform: str = "gpu", big_batch: int = 0, copy_mb: int = 256,
                 warmup: int = 200, start_timeout: float = 300.0) -> None:
        super().__init__(cpu=cpu, rate=rate, seconds=seconds, warmup=warmup,
                         start_timeout=start_timeout,
                         extra=("--platform", platform, "--big-batch", str(big_batch),
                                "--copy-mb", str(copy_mb)))


def main(argv: list[str] | None = None) -> int:
    ap = service.parser("bench/gpu_service.py", __doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="gpu", choices=tuple(PLATFORMS),
                    help="JAX's backend (default gpu; cpu: the loop without a GPU)")
    ap.add_argument("--width", type=int, default=512, help="the model's width")
    ap.add_argument("--big-batch", type=int, default=0,
                    help="the kernel switch's input rows, on the device (default 0: the "
                    "fewest, doubling from 4096, whose call takes --big-ms)")
    ap.add_argument("--big-ms", type=float, default=3.0,
                    help="with --big-batch 0: how long a call on the big input should take")
    ap.add_argument("--copy-mb", type=int, default=256,
                    help="the copy switch's device-to-host copy, MiB")
    return service.serve(ap.parse_args(argv), build=_build, control=GpuControl)


if __name__ == "__main__":
    sys.exit(main())
