"""Errors the CLI turns into one line on stderr and exit 1 (never a traceback)."""


class AgentError(Exception):
    """Bad input or an environment the command cannot work in; the message is for the user."""
