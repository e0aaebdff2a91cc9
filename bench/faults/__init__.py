"""Fault-injection kit for validating `hftagent watch` attribution (not shipped).

Each fault is a context manager producing one known cause on this machine; see
bench/faults/kit.py and bench/attribution.py.
"""
