"""isthmus.cloud (see DESIGN.md)."""
