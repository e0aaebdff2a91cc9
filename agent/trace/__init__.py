"""Kernel tracing shared by watch, cpus and attach."""
