"""Slots by key over the tiers: memory (the C core), SSD, remote.

`store` (the Store), `ssd` and `remote` (the tiers), `kvfile` (quantized
storage), `prefetch` (the prefetch engine).  No pyfuse3 below this line: it
imports only `_native`, the leaves (`knobs`, `trace`, `stats`, `private`) and
its own modules.
"""
