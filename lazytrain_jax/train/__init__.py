"""train (to be filled)."""
