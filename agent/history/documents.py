"""History as documents: a run as the ``hftagent.run`` v1 document (``history show --json``,
also a valid ``gate --baseline FILE``), and many as CSV (:data:`CSV_COLUMNS`) or as the
``hftagent.runs`` v1 JSON document (``history export``)."""

from __future__ import annotations

import csv
import json
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from .store import Run, Store

CSV_COLUMNS = ("id", "created_utc", "kind", "command", "scenario", "model_key", "model_hash",
               "variant", "tf_version", "host_digest", "sample_count", "p50_ns", "p99_ns",
               "p999_ns", "cold_start_ns", "gate_status")



def row(r: Run) -> dict:
    """A run's :data:`CSV_COLUMNS` (the listing's --json rows too)."""
    d = r.to_dict()
    return {k: d[k] for k in CSV_COLUMNS}


def export_doc(h: Store, r: Run, with_samples: bool) -> dict:
    """The ``hftagent.run`` v1 document (also a valid ``gate --baseline FILE``)."""
    d: dict = {"schema": "hftagent.run", "schema_version": 1, "run": r.to_dict(),
               "gate_results": h.gate_results(r.id)}
    if with_samples:
        lat = h.samples(r.id)
        d["latency_ns"] = None if lat is None else lat.tolist()
    return d


def write_export(f: IO[str], fmt: str, runs: list[Run], docs: list[dict] | None) -> None:
    """``runs`` as CSV, or ``docs`` (their :func:`export_doc`) as one hftagent.runs JSON
    document, to ``f``."""
    if fmt == "csv":
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in runs:
            cells = row(r)
            w.writerow(["" if cells[c] is None else cells[c] for c in CSV_COLUMNS])
    else:
        json.dump({"schema": "hftagent.runs", "schema_version": 1, "runs": docs}, f)
        f.write("\n")
