"""commands: the CLI, one thin module per command, each exposing ``register(app)``.

A command parses its options (validated once, CPUs through tuning/targets.py, units converted
at the edge), calls one function of the room that does the work, and renders. Shared options
and the error boundary (one line on stderr, exit 1) are in :mod:`.common`. May import every
room; nothing imports it but agent/cli.py."""
