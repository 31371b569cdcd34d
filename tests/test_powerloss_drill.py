"""The power-loss drill (tests/powerloss_drill.py): at least 20 cycles of a
workload of every kind of slot (packed, extent-logged, spilled) and of
namespace change, kill -9 of the daemon, a power loss, a remount; every
version and namespace change acknowledged durable comes back intact,
nothing removed durably comes back, damage done on purpose is detected and
never served, and what the power loss cut short is not called corruption.

On LazyFS over the test folder's file system (MEMOSFS_LAZYFS names its
binary), and on xfs and on ext4 mounted noauto_da_alloc (each on a loop
device, shut down without flushing its log: renames and unlinks not yet
committed are lost too).  MEMOSFS_POWERLOSS_CYCLES sets the cycles (20 on
LazyFS; 6 on each file system shut down, which `make test` runs wherever it
is root: about 40 s for both; docs/reliability.md's figures are of 25 cycles),
MEMOSFS_POWERLOSS_SEED replays a seed.  Each prints its figures as JSON
(docs/reliability.md has them, with the command).
"""

from __future__ import annotations

import json
import os
import random
import warnings

import pytest

from memosfs.testing.daemon import kill9

from lazyfs import LazyFS, ShutdownFS, lazyfs_reason, shutdown_reason
from powerloss_drill import run_drill

CYCLES = int(os.environ.get("MEMOSFS_POWERLOSS_CYCLES") or 20)
SHUTDOWN_CYCLES = int(os.environ.get("MEMOSFS_POWERLOSS_CYCLES") or 6)
SEED = int(os.environ.get("MEMOSFS_POWERLOSS_SEED") or random.SystemRandom().getrandbits(32))
OPTS = {"capacity": "4M", "writeback_delay_ms": 50}     # a tier smaller than the largest slots


def _kill(m) -> None:
    if kill9(m):
        warnings.warn("kill -9 left the daemon stuck in a request to its own mount; the "
                      "FUSE connection was aborted")


def _assert_clean(rep, cycles: int) -> None:
    why = f"seed {SEED} (MEMOSFS_POWERLOSS_SEED={SEED} replays it): " \
          f"{json.dumps(rep.summary())}\n" + "\n".join(rep.problems[:60])
    print(json.dumps(rep.summary()))
    assert rep.cycles == cycles, why
    assert rep.lost == 0, why
    assert rep.resurrected == 0, why
    assert rep.corrupt_served == 0, why
    assert rep.corrupt_unexplained == 0 and rep.error_lines == 0, why
    assert rep.writer_errors == 0, why
    assert rep.problems == [], why
    assert rep.versions_checked > cycles and rep.namespace_checked > cycles, why


@pytest.fixture
def lazy(tmp_path):
    reason = lazyfs_reason()
    if reason:
        pytest.skip(reason)
    fs = LazyFS(tmp_path / "lazy-root", tmp_path / "lazy", tmp_path / "lazy-work")
    fs.start()
    yield fs
    fs.stop()


@pytest.mark.slow
def test_power_loss_drill_on_lazyfs(lazy, make_mount, tmp_path):
    ssd = lazy.mnt / "ssd"
    (tmp_path / "drill").mkdir()
    rep = run_drill(str(tmp_path / "drill"), CYCLES, lambda: make_mount(ssd=ssd, **OPTS),
                    lazy.power_loss, lambda: str(ssd), _kill, seed=SEED,
                    fs="ext4 under LazyFS", progress=print)
    _assert_clean(rep, CYCLES)


@pytest.fixture(params=[("xfs", ""), ("ext4", "noauto_da_alloc")], ids=["xfs", "ext4-noauto_da_alloc"])
def shut_down(request, tmp_path):
    fstype, options = request.param
    reason = shutdown_reason(fstype)
    if reason:
        pytest.skip(reason)
    fs = ShutdownFS(tmp_path / "loop", fstype, options)
    fs.start()
    yield fs
    fs.stop()


@pytest.mark.slow
def test_power_loss_drill_on_a_file_system_shut_down(shut_down, make_mount, tmp_path):
    ssd = shut_down.mnt / "ssd"
    (tmp_path / "drill").mkdir()
    rep = run_drill(str(tmp_path / "drill"), SHUTDOWN_CYCLES,
                    lambda: make_mount(ssd=ssd, **OPTS), shut_down.power_loss,
                    lambda: str(ssd), _kill, seed=SEED,
                    fs=f"{shut_down.fstype} {shut_down.options}".strip() + " (shut down)",
                    progress=print)
    _assert_clean(rep, SHUTDOWN_CYCLES)
