"""isthmus.partitioner (see DESIGN.md)."""
