"""What the daemon and its clients agree on beyond POSIX: ioctl numbers,
and the mark a mount point keeps.

A leaf: it imports nothing, and both sides (`memosfs.fuse`, `memosfs.client`)
take their constants from here.
"""

__all__ = ["MEMOS_IOC_ACK", "MOUNTPOINT_XATTR"]


def _IO(kind: str, nr: int) -> int:
    """Linux's _IO(type, nr): an ioctl number that carries no data."""
    return (ord(kind) << 8) | nr


# ioctl(fd, MEMOS_IOC_ACK) on an open slot: its agent acknowledges the
# invalidation of its copy (as `setfattr -n user.memos.ack` does, without
# needing write permission).  Fails with EINVAL when there is nothing to
# acknowledge (the handle's agent was not invalidated, already acknowledged,
# or its hold was revoked), ENOTTY on anything that is not a memosfs slot.
MEMOS_IOC_ACK = _IO("M", 1)        # 0x4d01

# The daemon sets this extended attribute on its mount point directory before
# it mounts there (on the directory beneath the mount: hidden while mounted).
# A client that finds it on a path's directory, or an ancestor, while no
# memosfs is mounted there knows the path was meant for a mount that is gone
# (memosfs/client/mounts.py) and refuses it, instead of writing onto the disk
# beneath.
MOUNTPOINT_XATTR = "user.memosfs.mountpoint"

