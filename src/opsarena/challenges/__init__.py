"""challenges."""
