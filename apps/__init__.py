"""The top layer: what ties the wings together (the `isthmus` command and its subcommands, the demo,
graph-file I/O, `deploy_split`). It may import every other package of isthmus; nothing imports it
(tests/test_import_direction.py)."""
