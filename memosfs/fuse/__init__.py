"""The FUSE side of the daemon: request handlers over the store.

`operations` (MemosOperations, the pyfuse3 handlers, composed of the
mixins in `namespace`, `persist`, `opening`, `files`, `publish`, `xattrs`
and `notify` over `core`; the nodes in `nodes`; `routing` sends
`.federated` requests to `fedtree` and guards every handler), `control`
(the `.memos/` control plane: pseudo-files, knobs, stats), `coherence`
(the handlers' glue to the coherence directory), `pagecache` (pushes into the kernel page cache),
`tenants` (per-uid and per-agent fair share), `fedtree` (the `.federated/`
tree).  May import `memosfs.store`, the leaves (`knobs`, `trace`, `stats`,
`abi`, `private`) and `_native`; never `client`, `testing` or `bench`.
"""
