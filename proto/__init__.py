"""isthmus.proto (see DESIGN.md)."""
