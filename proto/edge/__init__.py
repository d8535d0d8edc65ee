"""Generated from proto/edge_model.fbs by proto/regen_edge.py; do not edit."""
