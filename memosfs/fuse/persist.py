"""The namespace as the tiers keep it: saving and restoring the tree
(a mixin of MemosOperations; composed in operations.py).

Owns: what the store asks of the namespace (`_slot_meta`, the metadata the
SSD and remote tiers keep beside a slot; `_namespace`, every directory,
symbolic link and special file for namespace.json), the restore at mount
(`restore`: directories and entries from namespace.json, then a slot for
each key the SSD tier holds; a slot or a directory wins over an entry of
the same name), and names made
from the remote tier's manifest (`_remote_name`: a slot another mount
published).  Both ways of making a slot from a tier's metadata go through
`_restore_slot` (the slot table's restore, with `Slot.apply_meta`, the
inverse of `Slot.meta`).

May call: the store (restore, ssd.read_json, remote_lookup), tenants
(quotas kept as xattrs), the OpsCore helpers (core.py).
"""

from __future__ import annotations

from typing import Optional

import trio

from memosfs.fuse.core import OpsCore, log
from memosfs.fuse.nodes import (
    AGENT, CONTROL_DIR, LINK_DIRS, SESSION, SUBDIR, Dir, Entry, Node, Slot, entry_from_record)
from memosfs.fuse.tenants import QUOTA_XATTR

__all__ = ["NamespacePersistence"]


class NamespacePersistence(OpsCore):
    """Saving and restoring the namespace (see the module docstring)."""

    def _slot_meta(self, key: bytes) -> dict:
        """What the SSD tier keeps beside a slot's bytes."""
        node = self._slot_by_key(key)
        return {} if node is None else node.meta()

    def _namespace(self) -> list[dict]:
        """Every directory, symbolic link and special file below the root,
        parents first, with owners, modes and times (namespace.json)."""
        out = []
        # (called from the store's threads: list() copies a directory's
        # entries in one step under the GIL while the request loop changes it)
        todo = [a for a in list(self.root.children.values())
                if isinstance(a, Dir) and a.level == AGENT]
        while todo:
            d = todo.pop(0)
            out.append(d.record())
            children = list(d.children.values())
            out.extend(c.record() for c in children if isinstance(c, Entry))
            todo.extend(c for c in children if isinstance(c, Dir))
        return out

    def restore(self) -> int:
        """At mount: directories and slots as the SSD tier kept them."""
        entries = self.store.restore()
        records = self.store.ssd.read_json("namespace.json", []) if self.store.ssd else []
        for rec in records:
            try:
                parts = rec["path"].split("/")
                if not all(parts) or CONTROL_DIR in parts[:1]:
                    raise ValueError(rec["path"])
                if rec.get("type") is not None:
                    self._restore_entry(parts, rec)
                    continue
                d = self._ensure_dirs(parts, rec["uid"], rec["gid"], rec["mode"])
                d.apply_record(rec)
                if d.level == AGENT and QUOTA_XATTR in d.xattrs:
                    self.tenants.set_quota(d.name, int(d.xattrs[QUOTA_XATTR]))
            except (KeyError, ValueError, TypeError, OSError) as e:
                log.error("namespace.json: bad record %r (%s); skipped", rec, e)
        for e in entries:
            parts = e.key.decode("utf-8", "surrogateescape").split("/")
            if len(parts) < 3 or not all(parts):
                log.error("SSD tier: slot key %r has no place in the tree; skipped", e.key)
                continue
            m = e.meta
            # (a folder namespace.json does not know: as a new one would be made)
            sess = self._ensure_dirs(parts[:-1], m.get("uid", 0), m.get("gid", 0),
                                     self._new_mode(0o755))
            name = parts[-1]
            if isinstance(sess.children.get(name), Entry):
                log.error("SSD tier: %r is a %s and a slot; the slot is kept", e.key,
                          sess.children[name].kind)
                self._detach(sess.children[name], "replaced")
            if name in sess.children:
                log.error("SSD tier: %r is a directory and a slot; the slot is skipped", e.key)
                continue
            self._restore_slot(sess, name, m, e.version, e.file_bytes, e.size)
        return len(entries)

    def _restore_slot(self, d: Dir, name: str, meta: dict, version: int, stored: int,
                      size: int, uid: int = 0, gid: int = 0) -> Slot:
        """A published slot as a tier keeps it (`meta`: what `Slot.meta`
        gave; the logical size from it, else `size`), in the slot table."""
        def make(ino: int) -> Slot:
            node = self._new_slot(ino, name, d, int(meta.get("mode", 0o644)) & 0o7777,
                                  int(meta.get("uid", uid)), int(meta.get("gid", gid)))
            node.apply_meta(meta)
            return node
        return self.slots.restore(d, name, version, int(meta.get("logical_size", size)),
                                  stored, make)

    def _restore_entry(self, parts: list[str], rec: dict) -> None:
        """A symbolic link or a special file from its namespace.json record
        (its directories come before it)."""
        if len(parts) < 2:
            raise ValueError(rec["path"])
        d = self._ensure_dirs(parts[:-1], rec["uid"], rec["gid"], 0o755)
        if d.level not in LINK_DIRS or parts[-1] in d.children:
            raise ValueError(f"{rec['path']}: no place for it")
        node = entry_from_record(self._new_ino(), parts[-1], d, rec)
        d.children[node.name] = node
        self.inodes[node.ino] = node

    def _ensure_dirs(self, parts: list[str], uid: int, gid: int, mode: int) -> Dir:
        d = self.root
        for depth, name in enumerate(parts):
            level = (AGENT, SESSION)[depth] if depth < 2 else SUBDIR
            child = d.children.get(name)
            if isinstance(child, Entry):
                # (a crash between two saves: a directory's slots win over an entry)
                log.error("restore: %s is a %s and a directory; the directory is kept",
                          child.path(), child.kind)
                self._detach(child, "replaced")
                child = None
            if not isinstance(child, Dir):
                child = Dir(self._new_ino(), name, d, int(mode) & 0o7777, int(uid),
                            int(gid), level)
                d.children[name] = child
                self.inodes[child.ino] = child
            d = child
        return d

    async def _remote_name(self, sess: Dir, n: str) -> Optional[Node]:
        """A name no local tier has: made from the remote tier's manifest (a
        slot another mount published), or None.  Network: off the loop."""
        key = sess.key_of(n)
        try:
            if self.mounted:
                e = await trio.to_thread.run_sync(self.store.remote_lookup, key)
            else:
                e = self.store.remote_lookup(key)
        except Exception:
            log.exception("remote lookup of %s", n)
            return None
        node = sess.children.get(n)
        if node is not None or e is None or sess.detached:
            return node                 # made meanwhile, absent, or the directory went
        return self._restore_slot(sess, n, e.meta, e.version, e.size, e.size, sess.uid,
                                  sess.gid)
