"""Op family 'array' (being written)."""
__all__: list = []
