"""executor (to be filled)."""
