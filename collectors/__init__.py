"""collectors: read the host. Imports nothing of ours; every path goes through :class:`Host`."""

from collectors.host import Host, HostError, Reading

__all__ = ["Host", "HostError", "Reading"]
