"""tuning: judge and change the host — audit checks, tunables, journal, profiles, launcher.

Reads the host only through collectors/."""
