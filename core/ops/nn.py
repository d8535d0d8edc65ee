"""Op family 'nn' (being written)."""
__all__: list = []
