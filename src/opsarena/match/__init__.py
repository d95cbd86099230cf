"""match."""
