"""isthmus.converters (see DESIGN.md)."""
