"""Op family 'conv' (being written)."""
__all__: list = []
