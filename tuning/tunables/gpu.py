"""GPU persistence mode and compute mode, through the NVML adapter (:class:`GpuControl`).

Never exercised on a real GPU (the round-trip script skips the ``gpu`` family: it changes
settings a shared GPU's other users depend on):
tests use a fake with the same shape. Needs root on the live host, like the file tunables.
"""

from __future__ import annotations

import errno

from tuning.tunables.base import Tunable, TuneContext, TuneError

COMPUTE_MODES = ("DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED")


class _Gpu(Tunable):
    family, scope = "gpu", "gpu"
    field = ""

    def available(self, ctx: TuneContext) -> str | None:
        if ctx.gpu is None:
            return ctx.gpu_reason
        try:
            n = ctx.gpu.device_count()
        except Exception as exc:  # NVML init failures surface here; report, do not crash
            return f"unsupported: NVML: {exc}"
        return None if n > 0 else "unsupported: no NVIDIA GPU"

    def index_of(self, target: str) -> int | None:
        parts = target.split(":")
        return int(parts[1][3:]) if len(parts) == 3 and parts[1][3:].isdigit() else None

    def _targets(self, ctx: TuneContext) -> list[str]:
        assert ctx.gpu is not None
        return [f"nvml:gpu{i}:{self.field}" for i in range(ctx.gpu.device_count())]


class GpuPersistence(_Gpu):
    """Persistence mode per GPU ("on" keeps the driver state loaded when no client is open).

    NVML: nvmlDeviceGetPersistenceMode / nvmlDeviceSetPersistenceMode (root).
    Equivalent: ``nvidia-smi -i N -pm 1``; query ``nvidia-smi --query-gpu=persistence_mode``.
    """

    id, title, key, field = "gpu.persistence", "GPU persistence mode", "gpu_persistence", \
        "persistence_mode"
    patterns = ("nvml:gpu[0-9]*:persistence_mode",)
    audit_ids = ("gpu.*.persistence",)

    def valid(self, value: str) -> bool:
        return value in ("on", "off")

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = str(self.wanted(ctx))
        if want not in ("on", "off"):
            raise TuneError(f"gpu_persistence {want!r} is not on/off")
        return dict.fromkeys(self._targets(ctx), want)

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        assert ctx.gpu is not None
        v = ctx.gpu.persistence_mode(self.index_of(target) or 0)
        return None if v is None else ("on" if v else "off")

    def write(self, ctx: TuneContext, target: str, value: str) -> None:
        if ctx.gpu is None:
            raise OSError(errno.ENODEV, ctx.gpu_reason)
        ctx.gpu.set_persistence_mode(self.index_of(target) or 0, value == "on")


class GpuComputeMode(_Gpu):
    """Compute mode per GPU; the profile asks EXCLUSIVE_PROCESS (one CUDA context at a time).

    NVML: nvmlDeviceGetComputeMode / nvmlDeviceSetComputeMode (root).
    Equivalent: ``nvidia-smi -i N -c EXCLUSIVE_PROCESS``; query ``--query-gpu=compute_mode``.
    """

    id, title, key, field = "gpu.compute_mode", "GPU compute mode", "gpu_compute_mode", \
        "compute_mode"
    patterns = ("nvml:gpu[0-9]*:compute_mode",)
    audit_ids = ("gpu.*.compute_mode",)

    def valid(self, value: str) -> bool:
        return value in COMPUTE_MODES

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = str(self.wanted(ctx))
        if want not in COMPUTE_MODES:
            raise TuneError(f"gpu_compute_mode {want!r} is not one of {', '.join(COMPUTE_MODES)}")
        return dict.fromkeys(self._targets(ctx), want)

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        assert ctx.gpu is not None
        return ctx.gpu.compute_mode(self.index_of(target) or 0)

    def write(self, ctx: TuneContext, target: str, value: str) -> None:
        if ctx.gpu is None:
            raise OSError(errno.ENODEV, ctx.gpu_reason)
        if value not in COMPUTE_MODES:
            raise OSError(errno.EINVAL, f"bad compute mode {value!r}")
        ctx.gpu.set_compute_mode(self.index_of(target) or 0, value)


class NvmlControl:
    """:class:`GpuControl` over the NVML adapter (collectors.gpu.Nvml), whose calls return a
    Reading: a None reading from a getter stays None; a refused setter becomes an OSError
    (EPERM for NoPermission, else EIO) so apply reports it like any failed write."""

    def __init__(self, nvml) -> None:
        self.nvml = nvml

    def device_count(self) -> int:
        r = self.nvml.device_count()
        if not r.ok:
            raise OSError(errno.ENODEV, f"NVML: {r.reason}")
        return int(r.value)

    def persistence_mode(self, index: int) -> bool | None:
        return self.nvml.persistence_mode(index).value

    def compute_mode(self, index: int) -> str | None:
        return self.nvml.compute_mode(index).value

    @staticmethod
    def _check(r) -> None:
        if not r.ok:
            code = errno.EPERM if "permission" in (r.reason or "").lower() else errno.EIO
            raise OSError(code, f"NVML: {r.reason}")

    def set_persistence_mode(self, index: int, on: bool) -> None:
        self._check(self.nvml.set_persistence_mode(index, on))

    def set_compute_mode(self, index: int, mode: str) -> None:
        self._check(self.nvml.set_compute_mode(index, mode))
