"""The vocabulary edge/ and cloud/ share: the tensor codec, TLS and tokens, trace-event checks, the
link model and its units, the split-file constants.

A leaf: it imports numpy and proto/ only (grpc lazily, when a channel is made), never core/, so
edge/ and cloud/ may both import it. Importing the package loads none of its modules.
"""
