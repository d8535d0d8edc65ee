"""isthmus.edge (see DESIGN.md)."""
