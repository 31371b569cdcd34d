"""The store's order, recency and metadata durability.

Every key is in its session's ring order (`_order`, by first publish) and
in the recency order (`_recency`, least recently used first: the warm-up
order).  Both are saved as order.json beside namespace.json (what the
namespace above gives, `namespace_of`) by the background writer when they
changed, and durably by sync_namespace (the fsync of a directory) and
flush; restore reads them back at mount.  A slot that leaves every tier by
itself is forgotten here and told to the drop listeners (_dropped).

Owns (as NamespaceMixin, one of Store's bases): _touch, _forget, _dropped,
sync_namespace, save_metadata, namespace_changed, restore.  Uses the state
Store.__init__ creates (cache, ssd, lock, _meta_lock, _order, _recency,
_dirty_since, _meta_pending, _renamed_unsaved, _recency_dirty, _namespace_dirty,
_drop_listeners, namespace_of).  Calls, through self, _write_back
(writeback.py); imports common and spill (its leftover files go at mount).  Lock
order: _meta_lock, then self.lock.
"""

from __future__ import annotations

import collections
import logging

from memosfs.store import spill
from memosfs.store.common import _session_of

log = logging.getLogger("memosfs.store.store")     # one logger for the whole store


class NamespaceMixin:
    """Order, recency, order.json / namespace.json (a base of Store; see the
    module docstring)."""

    # ---- order and recency ----

    def _touch(self, key: bytes) -> None:
        """Most recently used now; a key that is in no ring (removed meanwhile,
        e.g. by an unlink between a reader's get and this call) is not added
        back: _recency holds only keys that exist."""
        with self.lock:
            order = self._order.get(_session_of(key))
            if order is None or key not in order:
                return
            self._recency.pop(key, None)
            self._recency[key] = None
            self._recency_dirty = True
        if self.ssd is not None:
            self.ssd.used(key)                  # the SSD tier's policy counts it too

    def _order_pop(self, key: bytes) -> None:
        """Take key out of its directory's ring; an empty ring goes too (a
        directory made, filled and removed leaves nothing behind).  Under lock."""
        sess = _session_of(key)
        order = self._order.get(sess)
        if order is not None:
            order.pop(key, None)
            if not order:
                del self._order[sess]

    def _forget(self, key: bytes) -> None:
        with self.lock:
            self._order_pop(key)
            self._recency.pop(key, None)
            self.quant.forget(key)
            self._dirty_since.pop(key, None)
            self._meta_pending.pop(key, None)
            self._recency_dirty = True

    def _dropped(self, key: bytes, reason: str) -> None:
        self._forget(key)
        for fn in self._drop_listeners:
            try:
                fn(key, reason)
            except Exception:  # a listener must never break the store
                log.exception("drop listener failed for %r", key)

    # ---- durability ----

    def sync_namespace(self) -> None:
        """The fsync of a directory: make every rename, unlink and mkdir done
        so far durable (call it off the trio thread: it does file I/O).  A
        slot renamed while it had no SSD copy is written first, so that its
        new name exists after a crash; then the SSD folders touched are
        fsync'd, and namespace.json and order.json written durably."""
        if self.ssd is None:
            return
        with self.lock:
            renamed, self._renamed_unsaved = self._renamed_unsaved, set()
        for key in renamed:
            ref = self.cache.peek(key)
            if ref is None:
                continue
            try:
                if ref.dirty and self.ssd.get(key) is None:
                    self._write_back(ref, durable=False)
            except OSError:
                with self.lock:
                    self._renamed_unsaved.add(key)
                raise
            finally:
                ref.release()
        self.ssd.sync()
        self.save_metadata(durable=True)

    def save_metadata(self, durable: bool) -> None:
        """order.json (keys, most recent first), namespace.json (when the
        namespace changed, or durable) and policy.json.  namespace.json is
        always fdatasync'd before its rename (a power loss must leave the
        file a directory fsync made durable or the new one, never an empty
        one); order.json and policy.json only when durable, since the mount
        rebuilds them without (warm-up and eviction order from the files).
        durable: the SSD directory is fsync'd once, after the three."""
        if self.ssd is None:
            return
        with self._meta_lock:                   # the writer thread and an fsync may race
            with self.lock:
                recency = [k.decode("utf-8", "surrogateescape")
                           for k in reversed(self._recency)]
                changed = self._namespace_dirty
                self._recency_dirty = False
                self._namespace_dirty = False
            try:
                self.ssd.write_json("order.json", recency, durable, fsync=durable,
                                    dir_sync=False)
                if changed or durable:
                    self.ssd.write_json("namespace.json", self.namespace_of(), durable,
                                        fsync=True, dir_sync=False)
                self.ssd.save_policy(durable, dir_sync=False)
                if durable:
                    self.ssd.sync_root()
            except BaseException:
                self._recency_dirty = self._namespace_dirty = True
                raise

    def namespace_changed(self) -> None:
        self._namespace_dirty = True

    def restore(self) -> list:
        """At mount: rebuild the SSD index and the recency order; returns the
        namespace saved last time and the SSD entries."""
        if self.ssd is None:
            return []
        spill.clear(self.ssd.root)      # drafts a crash left unpublished (spill.py)
        entries = self.ssd.scan()
        saved = [k.encode("utf-8", "surrogateescape")
                 for k in self.ssd.read_json("order.json", [], logging.WARNING)]
        present = {e.key: e for e in entries}
        rank = {k: i for i, k in enumerate(saved)}
        # least recent first: saved order reversed, unknown keys (newer than
        # the last save) by file time as the most recent
        unknown = sorted((k for k in present if k not in rank),
                         key=lambda k: _mtime(present[k].path))
        known = sorted((k for k in present if k in rank), key=lambda k: -rank[k])
        with self.lock:
            for k in known + unknown:
                self._recency[k] = None
                self._order.setdefault(_session_of(k), collections.OrderedDict())[k] = None
        # the SSD tier's eviction order: its saved state, else this order
        self.ssd.restore_policy(known + unknown)
        return entries


def _mtime(path: str) -> float:
    import os
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
