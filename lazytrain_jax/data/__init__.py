"""data (to be filled)."""
