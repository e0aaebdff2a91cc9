"""The native reader behind ``hftagent watch --sampler native``: hftsampler.c (the C helper
that reads the hot files into a shared ring) and feed.py (its Python side)."""
