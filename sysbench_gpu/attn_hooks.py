"""Placeholder: hook-based attention attribution (issue 5)."""
