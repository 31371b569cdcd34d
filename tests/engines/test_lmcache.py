"""LMCache's storage engine on a real mount, its backends unchanged.

`fs://host:0/MNT/agent/session/...`: chunks stored by one LMCache process come
back whole (every chunk's SHA-256) in another process, and after the daemon is unmounted and mounted again on the same SSD
folder: the chunk files on memosfs are the index.

`local_disk: file://MNT/agent/session/...`: store and retrieve through the
mount in one process; a second LMCache process finds nothing (LMCache keeps
that backend's index in memory, on any filesystem), which is checked too so
docs/engines.md's advice (use fs:// for reuse across processes) stays true.

PYTHONHASHSEED is fixed in every LMCache process as docs/engines.md says: without
vLLM installed LMCache's chain of chunk hashes starts at 0 and names match in
any case, but with vLLM it starts from vLLM's NONE_HASH, random per process
unless PYTHONHASHSEED is set.

Each LMCache run is a child process (memosfs/bench/engines_lmcache.py).
Skipped with the reason when lmcache is not installed (`make engines-llama`).
"""

from __future__ import annotations

import os

import pytest

from memosfs.bench import engines_lmcache as eng

pytestmark = [pytest.mark.engines, pytest.mark.slow,
              pytest.mark.skipif(eng.missing() is not None, reason=str(eng.missing()))]

N_TOKENS = 1024          # 4 chunks of 256


def test_fs_backend_on_a_session_across_processes_and_a_remount(make_mount):
    m = make_mount(capacity="256M")
    folder = m.p("agent", "session", "lmcache")
    os.makedirs(m.p("agent", "session"))

    s = eng.run_worker("store", "fs", folder, N_TOKENS)
    assert s["checksums_ok"], s
    assert s["files"] == N_TOKENS // eng.CHUNK
    assert not [p for p in os.listdir(folder) if p.endswith(".tmp")]   # renamed into place

    r = eng.run_worker("retrieve", "fs", folder, N_TOKENS)
    assert r["retrieved"] == N_TOKENS and r["checksums_ok"], r

    ssd = m.ssd
    m.stop()
    m2 = make_mount(capacity="256M", ssd=ssd)
    r2 = eng.run_worker("retrieve", "fs", m2.p("agent", "session", "lmcache"), N_TOKENS)
    assert r2["retrieved"] == N_TOKENS and r2["checksums_ok"], r2


def test_local_disk_backend_on_a_session(make_mount):
    m = make_mount(capacity="256M")
    folder = m.p("agent", "session", "lmcache-disk")
    os.makedirs(m.p("agent", "session"))
    s = eng.run_worker("store", "local_disk", folder, N_TOKENS)
    assert s["retrieved"] == N_TOKENS and s["checksums_ok"], s
    files = [p for p in folder.rglob("*.pt")]
    assert len(files) == N_TOKENS // eng.CHUNK
    assert sum(p.stat().st_size for p in files) == s["bytes"]
    r = eng.run_worker("retrieve", "local_disk", folder, N_TOKENS)
    assert r["retrieved"] == 0, r          # its index lives in the process that stored
