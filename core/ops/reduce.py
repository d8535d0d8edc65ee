"""Op family 'reduce' (being written)."""
__all__: list = []
