"""Telling the kernel what changed: the kernel-notification side of
MemosOperations (a mixin; composed in operations.py).

Owns: the mount's notification life (`start_kernel_notifications`,
`stop_kernel_notifications`: the page-cache pusher and the attribute
refresher of pagecache.py, the `.federated` tree's notifications), dentry
and attribute invalidations (`_forget_entry`, `_forget_attrs`), page drops
asked by the coherence directory (`_invalidate_pages`, `_drop_pages_now`),
and slots the store let go by itself (`_slot_dropped`, from any thread).

Rules: attribute-only invalidation takes no kernel lock, so it is safe
inside a handler; dentry invalidation goes through pyfuse3's own thread;
page invalidation runs in a worker thread (the kernel may call back).
Nothing is sent before `mounted` is set.

May call: pyfuse3's notification functions, memosfs.fuse.pagecache, the
OpsCore helpers (core.py), `self.fed.start/stop`.
"""

from __future__ import annotations

import os
import threading

import pyfuse3
import trio

from memosfs.fuse.core import OpsCore, log
from memosfs.fuse.nodes import Dir, Node, Slot
from memosfs.fuse.pagecache import PageCachePusher

__all__ = ["KernelNotify"]


class KernelNotify(OpsCore):
    """Kernel notifications (see the module docstring)."""

    def start_kernel_notifications(self, mountpoint: str) -> None:
        """Called once mounted: dentry invalidations and page-cache pushes."""
        self.mounted = True
        self.mountpoint = mountpoint
        self.pusher = PageCachePusher(pyfuse3.notify_store, pyfuse3.invalidate_inode,
                                      self._refresh_kernel_attrs)
        self.fed.start()                # notifications on; resume interrupted rounds

    def _refresh_kernel_attrs(self, node: Slot) -> None:
        """From a worker thread: have the slot stat'ed through the mount, so the
        kernel holds its new mtime and size (the trio thread serves it)."""
        self._refresher.stat(os.path.join(self.mountpoint, os.fsdecode(node.key)))

    def stop_kernel_notifications(self) -> None:
        self.fed.stop()
        if self.pusher is not None:
            self.pusher.close()
            self.pusher = None
        self._refresher.close()
        self.mounted = False

    # ---- names and attributes ----

    def _forget_attrs(self, node: Node) -> None:
        """Make the kernel ask for node's attributes again (its cached size may
        be an older version's).  Attributes only: no page lock, no inode lock
        is taken, so this is safe inside a handler."""
        if self.mounted:
            try:
                pyfuse3.invalidate_inode(node.ino, attr_only=True)
            except OSError:
                pass                    # the kernel does not know this inode

    def _forget_entry(self, parent: Dir, name: str) -> None:
        """Tell the kernel to drop its cached dentry (from pyfuse3's thread)."""
        if self.mounted:
            pyfuse3.invalidate_entry_async(parent.ino, name.encode("utf-8", "surrogateescape"),
                                           ignore_enoent=True)

    # ---- slots the store let go ----

    def _slot_dropped_any_thread(self, key: bytes, reason: str) -> None:
        """Drops can come from the store's threads: apply them on the trio thread.

        An eviction's drop is decided in the eviction callback, before the C
        core frees the victim; a publish of the key can land in between (on
        the trio thread, or while a store thread evicts).  So it is applied
        later, on the trio thread, and only if no tier holds the key by then:
        the new version keeps its name."""
        token = self.trio_token
        if token is not None and reason in ("evicted", "ssd-evicted"):
            self._evicted_due[key] = reason     # (dict ops are atomic: any thread)
            try:
                token.run_sync_soon(self.apply_evictions)
            except trio.RunFinishedError:
                pass            # (the unmount's last flush: the names go with the mount)
            return
        if token is None or threading.current_thread() is threading.main_thread():
            self._slot_dropped(key, reason)
            return
        try:
            trio.from_thread.run_sync(self._slot_dropped, key, reason, trio_token=token)
        except trio.RunFinishedError:
            pass

    def apply_evictions(self) -> None:
        """The names of evicted slots that no tier holds now go (on the trio
        thread; also at unmount, before the consistency check)."""
        while self._evicted_due:
            try:
                key = next(iter(self._evicted_due))
                reason = self._evicted_due.pop(key)
            except (StopIteration, KeyError, RuntimeError):
                continue                # (another call took it)
            try:
                if self.store.tier_of(key) == "none":
                    self._slot_dropped(key, reason)
            except Exception:           # (run by trio itself: must not raise)
                log.exception("dropping the name of %r after its eviction failed", key)

    def _slot_dropped(self, key: bytes, reason: str) -> None:
        """The store let a slot go (eviction, ring, reset): remove its name."""
        node = self._slot_by_key(key)
        if node is None:
            return
        if reason == "ssd-evicted":
            ssd = self.store.ssd
            self.why.evicted(node.uid, key.decode("utf-8", "replace"),
                             f"the SSD tier reached its ssd_capacity "
                             f"({ssd.capacity if ssd is not None else 0} bytes) and evicts "
                             f"its coldest slots (ssd_full=evict); the slot is gone from "
                             f"every tier")
        parent = node.parent
        self._detach(node, reason)
        self._forget_entry(parent, node.name)

    # ---- pages (asked by the coherence directory) ----

    def _invalidate_pages(self, node: Node) -> None:
        """An invalidation reached the holders of node: drop the kernel's
        cached pages of it (from a worker thread: the kernel may call back)."""
        if not self.mounted or not isinstance(node, Slot):
            return
        self.slots.pages_dropped(node)      # (dropped later, from a worker thread)
        ino = node.ino
        trio.lowlevel.spawn_system_task(self._invalidate_inode_off_loop, ino)

    async def _drop_pages_now(self, node: Node) -> None:
        """As _invalidate_pages, but returns once the kernel dropped them."""
        if self.mounted and isinstance(node, Slot):
            await self._invalidate_inode_off_loop(node.ino)

    async def _invalidate_inode_off_loop(self, ino: int) -> None:
        try:
            await trio.to_thread.run_sync(pyfuse3.invalidate_inode, ino, False)
        except OSError as e:          # the kernel forgot the inode: nothing cached
            log.debug("invalidate_inode(%d): %s", ino, e)
