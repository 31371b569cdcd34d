"""The FUSE side of the daemon: request handlers over the store.

`operations` (the pyfuse3 handlers), `coherence` (the handlers' glue to the
coherence directory), `pagecache` (pushes into the kernel page cache),
`tenants` (per-uid and per-agent fair share), `fedtree` (the `.federated/`
tree).  May import `memosfs.store`, the leaves (`knobs`, `trace`, `stats`,
`abi`, `private`) and `_native`; never `client`, `testing` or `bench`.
"""
