"""The top layer: what ties the wings together (the `isthmus` command, the demo, graph-file I/O).

It may import every other package of isthmus; none of them imports it (tests/test_import_direction.py).
"""
