"""The chat screen's widgets, one per file."""
