"""Op family 'random' (being written)."""
__all__: list = []
