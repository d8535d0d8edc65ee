"""Op family 'training' (being written)."""
__all__: list = []
