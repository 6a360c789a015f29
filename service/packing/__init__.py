"""Packing algorithms (pure numpy)."""
