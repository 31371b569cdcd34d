"""The client refuses a path meant for a memosfs mount that is not there
(memosfs/client/mounts.py): after an unmount, `memosfs.kv` wrote its slots
onto the bare mount point directory, on the root disk."""

from __future__ import annotations

import errno
import os
import re

import numpy as np
import pytest

from memosfs.abi import MOUNTPOINT_XATTR
from memosfs.client import kv, mounts
from memosfs.client.shared import SharedSlots


def pairs():
    k = np.ones((1, 2, 4, 8), np.float32)
    return [(k, k * 2)]


def test_a_mount_point_with_nothing_mounted_is_refused_by_every_helper(make_mount):
    m = make_mount(capacity="64M")
    kv.save_kv(m.p("a", "s", "x"), pairs(), model_id="m", tokens=[1, 2, 3, 4])   # mounted
    assert kv.load_kv(m.p("a", "s", "x"), as_="numpy")[0][1][0, 0, 0, 0] == 2
    with SharedSlots() as slots:
        assert slots.read(str(m.p("a", "s", "x")))[:8]
    m.stop()
    assert MOUNTPOINT_XATTR in os.listxattr(m.path)     # the daemon's mark, beneath
    said = re.escape(f"{m.path} is a memosfs mount point with nothing mounted on it")
    calls = {
        "save_kv": lambda: kv.save_kv(m.p("a", "s", "y"), pairs(), model_id="m"),
        "write_slot": lambda: kv.write_slot(m.p("a", "s", "y"), b"bytes"),
        "load_kv": lambda: kv.load_kv(m.p("a", "s", "x"), as_="numpy"),
        "read_meta": lambda: kv.read_meta(m.p("a", "s", "x")),
        "find_longest_prefix": lambda: kv.find_longest_prefix(m.p("a", "s"), [1, 2, 3, 4],
                                                               block=2),
        "SharedSlots.read": lambda: SharedSlots().read(str(m.p("a", "s", "x"))),
    }
    for name, call in calls.items():
        with pytest.raises(kv.NotOnMount, match=said) as e:
            call()
        assert e.value.errno == errno.ENODEV and e.value.mountpoint == str(m.path), name
    assert os.listdir(m.path) == []                 # nothing written onto the disk beneath
    again = make_mount(capacity="64M")              # (the same mount point: tmp/mnt1)
    mounts.check_path(again.p("a", "s", "z"))       # a live mount is fine


def test_fstab_names_a_mount_point_and_other_paths_work(tmp_path, monkeypatch):
    (tmp_path / "mnt").mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text("# a comment\nmemos  %s  fuse.memosfs  capacity=4G  0 0\n"
                     "tmpfs  /elsewhere  tmpfs  defaults  0 0\n" % (tmp_path / "mnt"))
    monkeypatch.setattr(mounts, "FSTAB", str(fstab))
    with pytest.raises(mounts.NotOnMount) as e:
        kv.save_kv(tmp_path / "mnt" / "a" / "s" / "x", pairs(), model_id="m")
    assert e.value.mountpoint == str(tmp_path / "mnt")
    assert not (tmp_path / "mnt" / "a").exists()
    kv.save_kv(tmp_path / "plain" / "x", pairs(), model_id="m")      # anywhere else: fine
    assert kv.read_meta(tmp_path / "plain" / "x")["model"] == "m"
