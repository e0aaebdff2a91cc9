"""The watch sampler: reads the collectors' files at ``sample_hz`` into the signal rings.

python (the Python sampler: a thread pinned to a housekeeping CPU runs the collectors each
round), native/ (the native reader: a C helper reads the hot files, the Python side replays its
recorded rounds through the same collectors). Nothing heavy at import.
"""
