"""PCIe errors: AER error counters of the devices (the pcie collector's ``*_total``
counters under ``.aer_``) rising in the window."""

from __future__ import annotations

from agent.watch.attribution.spike import CauseScore, Context

AER_ERRORS = 0.6  # any AER error counted in the window


def pcie_errors(ctx: Context) -> CauseScore | None:
    v = ctx.views.get("pcie")
    if v is None:
        return None
    ev, s, details = {}, 0.0, []
    for name in v.names("pcie."):
        if "_total" in name and ".aer_" in name:
            w = v.counter(name)
            if w is not None and w.window > 0:
                ev[name] = w.window
                s = max(s, AER_ERRORS)
                details.append(f"{name}: +{w.window:.0f}")
    return CauseScore("pcie_errors", s, detail="; ".join(details), evidence=ev) if s else None
