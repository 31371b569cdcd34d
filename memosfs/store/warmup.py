"""The store's warm-up: the most recently used SSD slots into memory at mount.

start_warmup plans, most recent first, the SSD slots that fit in
ratio × capacity, and a thread ("memosfs-warmup") promotes them, asking the
disk for WARMUP_READ_AHEAD slots ahead of the one it copies; it stops when
memory is full or the store closes.  Progress: warmup_loaded_bytes,
_warm_total, _warm_done (StoreStats).

Owns (as WarmupMixin, one of Store's bases): start_warmup, _warmup.  Uses
the state Store.__init__ creates (cache, ssd, lock, _recency, _c,
_warm_total, _warm_done, _stop, _threads).  Calls, through self, _promote
and _in_memory (reads.py); imports memosfs._native and memosfs.store.ssd.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from memosfs import _native
from memosfs.store.ssd import SSDEntry

log = logging.getLogger("memosfs.store.store")     # one logger for the whole store

WARMUP_READ_AHEAD = 2       # slots the warm-up asks the disk for ahead of the one it copies


class WarmupMixin:
    """The warm-up thread (a base of Store; see the module docstring)."""

    # ---- warm-up ----

    def start_warmup(self, ratio: float, progress: Optional[Callable[[int, int], None]] = None
                     ) -> None:
        """Preload the most recently used SSD slots, up to ratio × capacity,
        in a background thread."""
        if self.ssd is None or ratio <= 0:
            self._warm_done = 1
            return
        budget = int(ratio * self.cache.capacity)
        with self.lock:
            keys = list(reversed(self._recency))
        plan, total = [], 0
        for key in keys:
            e = self.ssd.get(key)
            if e is None or total + e.size > budget:
                continue
            plan.append(e)
            total += e.size
        self._warm_total = total
        t = threading.Thread(target=self._warmup, args=(plan, progress),
                             name="memosfs-warmup", daemon=True)
        t.start()
        self._threads.append(t)

    def _warmup(self, plan: list[SSDEntry], progress) -> None:
        loaded = 0
        ahead = 0                               # plan[:ahead] were asked to be read in
        try:
            for i, entry in enumerate(plan):
                if self._stop.is_set():
                    return
                # keep the disk busy: ask for the next slots while copying this one
                while ahead < len(plan) and ahead <= i + WARMUP_READ_AHEAD:
                    self.ssd.prefetch(plan[ahead])
                    ahead += 1
                if self._in_memory(entry.key):
                    loaded += entry.size
                    self._c["warmup_loaded_bytes"] = loaded
                    continue
                if self.cache.stats()["free_pages"] * _native.PAGE_SIZE < entry.size:
                    log.info("warm-up stops: memory is full")
                    break
                ref = self._promote(entry.key)
                if ref is not None:
                    ref.release()
                loaded += entry.size
                self._c["warmup_loaded_bytes"] = loaded
                if progress:
                    progress(loaded, self._warm_total)
        except Exception:
            log.exception("warm-up failed")
        finally:
            self._warm_done = 1
            if progress:
                progress(loaded, self._warm_total)
            log.info("warm-up done: %d of %d bytes", loaded, self._warm_total)
