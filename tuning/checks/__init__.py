"""Audit checks: one module per family, each exposing ``check(ctx) -> list[Finding]``.

Checks read the host only through collectors/ and never write. The order of FAMILIES in
tuning/audit.py is the order of the report.
"""
