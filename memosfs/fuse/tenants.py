"""Fair share between the uids and agents of one mount.

A mount is shared by agents running under different uids.  The kernel's
permission checks keep their trees apart; this module keeps one of them
from taking the memory tier away from the others.  Three bounds:

pins (`pin_max_per_uid`)
    `setfattr -n user.memos.pin -v 1 SLOT` keeps a slot's version out of
    eviction.  The bytes a uid has pinned (the stored bytes of the versions
    it pinned that are still pinned) may not pass the knob; a pin beyond it
    is EDQUOT.  Root is not bounded.

open handles (`hold_max_per_uid`)
    A read handle keeps its version in memory until it is closed, and a
    write handle keeps its draft.  The memory a uid's open handles keep
    (read versions, counted once per version, plus the drafts its writers
    started) may not pass the knob: an open for reading beyond it, or a
    write that grows a draft beyond it, is EDQUOT.  Root is not bounded.

agent quotas (`user.memos.quota` on an agent directory, set by root)
    A byte quota on an agent's share of the memory tier.  The agent's
    slots are counted by the C core (`Cache.set_quota`, `Cache.tenant`);
    while they fit the quota no other tenant's write can evict them.  A
    write or publish that would take the agent beyond its quota first moves
    the agent's own least recently used slots to the SSD tier (written back
    if dirty, then dropped from memory: nothing is lost); when that cannot
    make room (no SSD tier, or its slots are all open or pinned), the write
    is EDQUOT.  Agents without a quota share what the quotas leave, by the
    eviction policy.  A quota larger than the memory tier is refused
    (EINVAL: it could never be met); quotas whose sum passes the capacity
    are kept, with a WARNING in the log (`check_quotas`): agents within
    their quotas can then find the memory tier full (ENOSPC).

Knob values are a size (`16M`, bytes) or a share of the memory tier's
capacity (`25%`), resolved against the capacity at each check, so they
follow `capacity` changes.  Every refusal is logged with the uid or agent,
what it holds and the bound.

Owns: `Tenants` (the per-uid and per-agent accounts), `OverLimit` and
`TenantStats` (its figures).
May call: the store (peek, keys_lru_first, demote, cache quotas) and the
knobs mapping it is given; nothing of the handlers (they call it).
"""

from __future__ import annotations

import collections
import logging
import weakref
from dataclasses import dataclass
from typing import Optional

from memosfs import _native
from memosfs.stats import Record, counter, gauge

log = logging.getLogger("memosfs.fuse.tenants")

QUOTA_XATTR = b"user.memos.quota"
USAGE_XATTR = b"user.memos.usage"


@dataclass(frozen=True)
class TenantStats(Record):
    """Tenants (pins, open handles, agent quotas).

    See "Several users on one mount": each refusal is an EDQUOT answer."""
    pin_refused: int = counter("pins refused: the uid's pinned bytes would pass pin_max_per_uid")
    hold_refused: int = counter("opens and writes refused: the uid's open handles would pass "
                                "hold_max_per_uid")
    quota_refused: int = counter("writes refused: the agent would pass its quota")
    quota_evictions: int = counter("slots an agent over its quota moved to the SSD tier")
    quota_agents: int = gauge("agents with a quota now")


class OverLimit(Exception):
    """A request beyond a tenant bound; str(e) says which and why."""


def resolve(value: object, capacity: int) -> int:
    """A knob value (bytes, or 'N%' of capacity) as bytes."""
    if isinstance(value, str) and value.endswith("%"):
        return capacity * int(value[:-1]) // 100
    return int(value)


class Tenants:
    """Per-uid pins and handle holds, per-agent quotas.  Runs on the trio
    thread (the filesystem's handlers); the C core's tenant counters are
    read under its own lock."""

    def __init__(self, store, knobs: dict) -> None:
        self.store = store
        self.knobs = knobs
        # uid -> {slot node: (version, stored bytes)} of the pins it set
        # uid -> {slot: (version, stored)}: a pin follows the slot's name
        # (node.key) across rewrites and renames, and goes once no version
        # of that name is pinned (pinned_bytes)
        self._pins: dict[int, dict] = {}
        # uid -> {(inode, version): [handles, stored bytes]} of its read handles
        self._held: dict[int, dict[tuple, list]] = {}
        self._held_bytes: collections.Counter = collections.Counter()
        # uid -> slot nodes whose draft its writer started
        self._drafts: dict[int, "weakref.WeakSet"] = {}
        self.quotas: dict[str, int] = {}    # agent -> its quota (bytes)
        self.c = collections.Counter()

    # ---- bounds ----

    def limit(self, knob: str) -> int:
        return resolve(self.knobs[knob], self.store.cache.capacity)

    # ---- pins ----

    def pinned_bytes(self, uid: int) -> int:
        pins = self._pins.get(uid)
        if not pins:
            return 0
        total = 0
        for node in list(pins):
            # a pin belongs to the slot: a rewrite keeps it (on its new size)
            ref = self.store.peek(node.key)
            nbytes = ref.stored if ref is not None and ref.sticky else -1
            if ref is not None:
                ref.release()
            if nbytes >= 0:
                total += nbytes
            else:
                del pins[node]
        if not pins:
            self._pins.pop(uid, None)   # a uid with no pin left keeps no entry
        return total

    def check_pin(self, uid: int, node, ref) -> None:
        """Before a pin by uid of node's version ref: OverLimit beyond the
        uid's share."""
        if uid == 0:
            return
        mine = self._pins.get(uid)
        if mine is not None and node in mine:
            return                      # pinned by this uid already
        have = self.pinned_bytes(uid)
        bound = self.limit("pin_max_per_uid")
        if have + ref.stored > bound:
            self.c["pin_refused"] += 1
            raise OverLimit(f"uid {uid} has {have} bytes pinned; {ref.stored} more "
                            f"would pass pin_max_per_uid ({bound} bytes)")

    def pin_kept(self, key: bytes, ref) -> None:
        """A pinned slot got a new version, which keeps the pin (the C core
        carries it): a uid whose pins would now pass pin_max_per_uid loses
        this one, with a warning in the log."""
        if not ref.sticky:
            return
        bound = self.limit("pin_max_per_uid")
        for uid, pins in list(self._pins.items()):
            if uid == 0:
                continue
            mine = [n for n in list(pins) if n.key == key]
            if mine and self.pinned_bytes(uid) > bound:
                ref.sticky = False
                for n in mine:
                    pins.pop(n, None)
                log.warning("%s: unpinned: its new version (%d bytes) takes uid %d past "
                            "pin_max_per_uid (%d bytes)", key.decode("utf-8", "replace"),
                            ref.stored, uid, bound)

    def pinned(self, uid: int, node, ref, on: bool) -> None:
        """A pin (on) or unpin of node's version ref took effect."""
        if on:
            self._pins.setdefault(uid, {})[node] = (
                ref.version, ref.stored)
            return
        for u, pins in list(self._pins.items()):
            pins.pop(node, None)
            if not pins:
                del self._pins[u]

    # ---- open handles ----

    def hold(self, uid: int, ino: int, ref) -> None:
        """A read handle of uid takes version ref: OverLimit beyond its share."""
        if not isinstance(ref, _native.Ref):
            return                      # read from the SSD tier: keeps no memory
        held = self._held.setdefault(uid, {})
        ident = (ino, ref.version)
        entry = held.get(ident)
        if entry is None:
            if uid != 0:
                have = self._held_bytes[uid] + self.draft_bytes(uid)
                bound = self.limit("hold_max_per_uid")
                if have + ref.stored > bound:
                    self.c["hold_refused"] += 1
                    if not held:
                        del self._held[uid]
                    raise OverLimit(
                        f"uid {uid}'s open handles keep {have} bytes in memory; "
                        f"{ref.stored} more would pass hold_max_per_uid ({bound} bytes)")
            entry = held[ident] = [0, ref.stored]
            self._held_bytes[uid] += ref.stored
        entry[0] += 1

    def unhold(self, uid: int, ino: int, ref) -> None:
        if not isinstance(ref, _native.Ref):
            return
        held = self._held.get(uid)
        entry = held.get((ino, ref.version)) if held else None
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            del held[(ino, ref.version)]
            self._held_bytes[uid] -= entry[1]
            if not held:
                del self._held[uid]
                del self._held_bytes[uid]

    def draft_started(self, uid: int, node) -> None:
        self._drafts.setdefault(uid, weakref.WeakSet()).add(node)

    def draft_bytes(self, uid: int) -> int:
        nodes = self._drafts.get(uid)
        if not nodes:
            return 0
        total = 0
        for node in list(nodes):
            if node.draft is None:
                nodes.discard(node)
            elif not getattr(node.draft, "spilled", False):    # (a spilled draft
                total += node.draft.size                        # holds no memory)
        if not nodes:
            self._drafts.pop(uid, None)
        return total

    def check_draft(self, uid: int, node, new_size: int) -> None:
        """A write by uid grows node's draft to new_size bytes."""
        if uid == 0:
            return
        cur = node.draft.size if node.draft is not None else 0
        if new_size <= cur:
            return
        have = self._held_bytes[uid] + self.draft_bytes(uid)
        bound = self.limit("hold_max_per_uid")
        if have + new_size - cur > bound:
            self.c["hold_refused"] += 1
            raise OverLimit(f"uid {uid}'s open handles keep {have} bytes in memory; "
                            f"a draft of {new_size} bytes would pass hold_max_per_uid "
                            f"({bound} bytes)")

    # ---- agent quotas ----

    def usage(self, agent: str) -> Optional[tuple[int, int, int]]:
        """(quota, bytes in memory, slots in memory) of an agent with a quota."""
        return self.store.cache.tenant(agent.encode("utf-8", "surrogateescape"))

    def memory_bytes(self, agent: str) -> int:
        """Bytes of the memory tier an agent's slots hold now (pages, as the
        quota counts them; `user.memos.usage`): the C core's account for an
        agent with a quota, else the sum over its slots in memory (one pass
        over the keys)."""
        t = self.usage(agent)
        if t is not None:
            return t[1]
        prefix = agent.encode("utf-8", "surrogateescape") + b"/"
        cache = self.store.cache
        total = 0
        for key in cache.keys():
            if not key.startswith(prefix):
                continue
            ref = cache.peek(key)
            if ref is None:
                continue
            try:
                total += ref.stored
            finally:
                ref.release()
        return total

    def set_quota(self, agent: str, nbytes: int) -> None:
        """Give agent a quota (0: take it away).  ValueError for a name the
        C core cannot keep, OSError when too many agents have one."""
        self.store.cache.set_quota(agent.encode("utf-8", "surrogateescape"), nbytes)
        if nbytes:
            self.quotas[agent] = nbytes
        else:
            self.quotas.pop(agent, None)

    def check_quota(self, agent: str, nbytes: int) -> None:
        """ValueError if a quota of nbytes for agent can never be met (more
        than the memory tier)."""
        capacity = self.store.cache.capacity
        if nbytes > capacity:
            raise ValueError(f"a quota of {nbytes} bytes is larger than the memory tier "
                             f"({capacity} bytes: the capacity knob)")

    def check_quotas(self) -> bool:
        """A WARNING in the log when the quotas add up to more than the
        memory tier (after a quota or the capacity changed); False then."""
        total, capacity = sum(self.quotas.values()), self.store.cache.capacity
        if total > capacity:
            log.warning("agent quotas add up to %d bytes, more than the memory tier (%d "
                        "bytes): agents within their quotas can find it full (ENOSPC)",
                        total, capacity)
            return False
        return True

    def make_room(self, agent: str, need: int, keep: Optional[bytes] = None) -> None:
        """Before agent's memory grows by need bytes: move its own least
        recently used slots to the SSD tier until it fits its quota.
        OverLimit when it cannot."""
        if agent not in self.quotas:
            return
        t = self.usage(agent)
        if t is None:
            return
        quota, used, _ = t
        if used + need <= quota:
            return
        if need > quota:
            self.c["quota_refused"] += 1
            raise OverLimit(f"agent {agent!r}: {need} bytes are more than its quota "
                            f"({quota} bytes)")
        prefix = agent.encode("utf-8", "surrogateescape") + b"/"
        for key in self.store.keys_lru_first(prefix):
            if key == keep:
                continue
            if self.store.demote(key):
                self.c["quota_evictions"] += 1
                used = self.usage(agent)[1]
                if used + need <= quota:
                    return
        self.c["quota_refused"] += 1
        raise OverLimit(f"agent {agent!r} holds {used} bytes in memory; {need} more "
                        f"would pass its quota ({quota} bytes) and none of its slots can "
                        f"move to the SSD tier (open, pinned, or no SSD tier)")

    def statistics(self) -> TenantStats:
        return TenantStats(pin_refused=self.c["pin_refused"],
                           hold_refused=self.c["hold_refused"],
                           quota_refused=self.c["quota_refused"],
                           quota_evictions=self.c["quota_evictions"],
                           quota_agents=len(self.quotas))
