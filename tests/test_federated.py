"""memosfs.federated without a mount: client helpers, masks, HE, accounting, and the
FederatedJobs tree (refusals, rounds, persistence).  Every random draw is seeded and
every statistical check has a tolerance far outside its sampling error, so nothing
here can flake."""

from __future__ import annotations

import errno
import functools
import math
import threading

import numpy as np
import pytest

fed = pytest.importorskip("memosfs.federated")
pytest.importorskip("cryptography")

from memosfs.federated import (  # noqa: E402
    FedClient, FedError, InprocTransport, clip_gradients, decode_fixed,
    decrypted_sum_bytes, encode_fixed, epsilon_for, generate_keypair, global_norm,
    he_keygen, make_update, mask_update, noise_injection, parse_config, st_load, st_save)
from memosfs.federated.engine import DirKV, FederatedJobs, MemoryKV  # noqa: E402
from memosfs.testing.errnos import errno_of as _errno_of  # noqa: E402

errno_of = functools.partial(_errno_of, raises=FedError)     # only refusals count

OWNER = 1000
SHAPES = {"w": (8, 5), "b": (5,)}


def kv_kinds():
    return ["memory", "dir"]


def make_kv(kind, tmp_path):
    return MemoryKV() if kind == "memory" else DirKV(str(tmp_path / "kv"))


def params0(shapes=SHAPES, dtype=np.float32, seed=0):
    g = np.random.default_rng(seed)
    return {k: g.normal(size=s).astype(dtype) for k, s in shapes.items()}


def new_job(jobs, name="job", config="clients = alice,bob,carol\nnoise_multiplier = 0\n",
            params=None):
    jobs.mkdir((name,), OWNER, OWNER, 0o755)
    jobs.write((name, "config"), config.encode(), OWNER)
    p = params if params is not None else params0()
    jobs.write((name, "params.safetensors"), st_save(p), OWNER)
    return p


def upload(jobs, job, client, data, uid=None):
    """As fs.py would: create the name, then write the whole content at close."""
    uid = OWNER + 1 + hash(client) % 7 if uid is None else uid
    parts = (job, "updates", client + ".safetensors")
    jobs.create(parts, uid, uid, 0o644)
    jobs.write(parts, data, uid, uid)


def delta(seed, shapes=SHAPES, scale=0.1, dtype=np.float32):
    g = np.random.default_rng(seed)
    return {k: (scale * g.normal(size=s)).astype(dtype) for k, s in shapes.items()}


def plain_update(d, rnd, **meta):
    return st_save(d, {"round": str(rnd), "encoding": "plain", **meta})


def current(jobs, job):
    return st_load(jobs.read((job, "params.safetensors")))


# ------------------------------------------------------------------ client helpers


def test_clip_bound_holds_numpy_and_torch():
    g = np.random.default_rng(1)
    for scale in (1e-3, 0.5, 3.0, 1e4):
        u = {"a": scale * g.normal(size=(30, 7)), "b": scale * g.normal(size=(11,)).astype(np.float32)}
        for C in (0.1, 1.0, 5.0):
            c = clip_gradients(u, C)
            n0, n1 = global_norm(u), global_norm(c)
            assert n1 <= C * (1 + 1e-6)
            if n0 <= C:
                assert all(np.array_equal(c[k], u[k]) for k in u)      # untouched
            else:
                assert n1 == pytest.approx(C, rel=1e-5)                # scaled, not cut
                assert np.allclose(c["a"] / u["a"], C / n0)
            assert c["b"].dtype == np.float32
    torch = pytest.importorskip("torch")
    t = {"x": torch.randn(100, generator=torch.Generator().manual_seed(0)) * 10}
    ct = clip_gradients(t, 1.0)
    assert isinstance(ct["x"], torch.Tensor) and float(ct["x"].norm()) <= 1.0 + 1e-5
    nt = noise_injection(ct, 0.5, rng=0)
    assert isinstance(nt["x"], torch.Tensor) and nt["x"].dtype == torch.float32


def test_noise_has_the_configured_scale():
    sigma = 0.37
    out = noise_injection({"z": np.zeros(200_000)}, sigma, rng=123)["z"]
    # standard error of the sample std is sigma/sqrt(2N) ~ 0.16%; 2% cannot flake
    assert np.std(out) == pytest.approx(sigma, rel=0.02)
    assert abs(np.mean(out)) < 5 * sigma / math.sqrt(out.size)
    again = noise_injection({"z": np.zeros(200_000)}, sigma, rng=123)["z"]
    assert np.array_equal(out, again)                                   # seeded


def test_fixed_point_roundtrip():
    v = np.array([0.0, 1.5, -2.25, 1e-9, -12345.678, 1e5])
    assert np.allclose(decode_fixed(encode_fixed(v)), v, atol=2 ** -32)
    with pytest.raises(ValueError):
        encode_fixed(np.array([2.0 ** 21]))
    with pytest.raises(ValueError):
        encode_fixed(np.array([np.nan]))


def _keys(n):
    return [generate_keypair(bytes([i + 1]) * 32) for i in range(n)]


def test_masks_cancel_exactly():
    n, d = 5, 3001
    names = [f"c{i}" for i in range(n)]
    keys = _keys(n)
    peers = {nm: pub for nm, (_, pub) in zip(names, keys)}
    g = np.random.default_rng(2)
    xs = [g.normal(size=d) for _ in range(n)]
    fixed = [encode_fixed(x) for x in xs]
    masked = [mask_update(f, nm, priv, peers, "job", 7)
              for f, nm, (priv, _) in zip(fixed, names, keys)]
    total = np.zeros(d, np.uint64)
    for m in masked:
        total += m
    want = np.zeros(d, np.uint64)
    for f in fixed:
        want += f
    assert np.array_equal(total, want)                  # exact in Z/2^64
    assert np.allclose(decode_fixed(total), sum(xs), atol=n * 2 ** -32)
    # another round gets other masks from the same keys
    m2 = mask_update(fixed[0], names[0], keys[0][0], peers, "job", 8)
    assert not np.array_equal(m2, masked[0])
    # without one participant the masks do not cancel
    part = np.zeros(d, np.uint64)
    for m in masked[:-1]:
        part += m
    assert np.mean(np.abs(decode_fixed(part)) > 1e3) > 0.99


def test_masked_view_is_independent_of_the_data():
    stats = pytest.importorskip("scipy.stats")
    keys = _keys(3)
    peers = {f"c{i}": pub for i, (_, pub) in enumerate(keys)}
    d = 20_000
    zero = np.zeros(d)
    big = 1000.0 * np.random.default_rng(3).standard_normal(d) + 5e4
    views = []
    for x in (zero, big):
        m = mask_update(encode_fixed(x), "c0", keys[0][0], peers, "job", 1)
        views.append(m.astype(np.float64) / 2.0 ** 64)     # the server's view, in [0, 1)
    for v in views:
        # uniform on [0, 1): KS against the uniform law; deterministic keys, so the
        # p-value is a fixed number -- the threshold is about the law, not luck
        assert stats.kstest(v, "uniform").pvalue > 1e-3
        assert abs(v.mean() - 0.5) < 0.01
    assert stats.ks_2samp(views[0], views[1]).pvalue > 1e-3
    # the data themselves are trivially told apart
    assert stats.ks_2samp(zero, big).pvalue < 1e-100
    # low bits, which carry the fixed-point fraction, are uniform too
    low = (mask_update(encode_fixed(big), "c0", keys[0][0], peers, "job", 1) & np.uint64(0xFF))
    counts = np.bincount(low.astype(np.int64), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_accounting_grows_and_matches_dp_accounting():
    pytest.importorskip("dp_accounting")
    from dp_accounting import dp_event, rdp
    eps = [epsilon_for([1.1] * r, 1e-5) for r in range(1, 6)]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    acc = rdp.RdpAccountant()
    acc.compose(dp_event.GaussianDpEvent(1.1), 5)
    assert eps[-1] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert epsilon_for([], 1e-5) == 0.0
    assert epsilon_for([1.0, 0.0], 1e-5) == math.inf


def test_config_parsing():
    c = parse_config("clients = b, a\nclip_norm=2.5\nmode secure  # comment\n")
    assert c["clients"] == ["a", "b"] and c["clip_norm"] == 2.5 and c["mode"] == "secure"
    c2 = parse_config('{"noise_multiplier": 0.5, "clients": 4}', c)
    assert c2["clients"] == 4 and c2["noise_multiplier"] == 0.5 and c2["clip_norm"] == 2.5
    for bad in ("clip_norm = 0", "clip_norm = nan", "mode = fancy", "delta = 1",
                "bogus = 1", "clients = a,a", "noise_multiplier = -1", "no_equals_here",
                "clients = 2\nmin_clients = 3", "learning_rate = -1", "{not json"):
        with pytest.raises(ValueError):
            parse_config(bad)


# ------------------------------------------------------------------ the tree


def test_tree_modes_and_owner():
    jobs = FederatedJobs(MemoryKV())
    assert jobs.getattr(())["mode"] == 0o1777
    new_job(jobs)
    a = jobs.getattr(("job",))
    assert a["kind"] == "dir" and a["uid"] == OWNER and a["mode"] == 0o755
    assert jobs.readdir(("job",)) == ["aggregate", "config", "he", "history", "keys",
                                      "params.safetensors", "privacy", "round", "status",
                                      "updates"]
    modes = {n: jobs.getattr(("job", n))["mode"] for n in jobs.readdir(("job",))}
    assert modes == {"aggregate": 0o200, "config": 0o644, "he": 0o755, "history": 0o444,
                     "keys": 0o1777, "params.safetensors": 0o644, "privacy": 0o444,
                     "round": 0o444, "status": 0o444, "updates": 0o1733}
    for n in ("config", "round", "privacy", "status", "params.safetensors"):
        assert jobs.getattr(("job", n))["size"] == len(jobs.read(("job", n)))
    assert jobs.read(("job", "round")) == b"0\n"
    upload(jobs, "job", "alice", plain_update(delta(1), 0), uid=2001)
    u = jobs.getattr(("job", "updates", "alice.safetensors"))
    assert u["uid"] == 2001 and u["mode"] == 0o200
    assert errno_of(jobs.read, ("job", "updates", "alice.safetensors")) == errno.EACCES
    assert errno_of(jobs.write, ("job", "round"), b"5", OWNER) == errno.EACCES
    assert errno_of(jobs.write, ("job", "config"), b"clip_norm = 3", 2001) == errno.EACCES
    assert errno_of(jobs.write, ("job", "params.safetensors"), st_save(params0()), 2001) \
        == errno.EACCES
    assert errno_of(jobs.mkdir, ("job",), 1, 1, 0o755) == errno.EEXIST
    assert errno_of(jobs.mkdir, ("job", "x"), OWNER, OWNER, 0o755) == errno.EPERM
    assert errno_of(jobs.mkdir, (".hidden",), OWNER, OWNER, 0o755) == errno.EINVAL
    assert errno_of(jobs.create, ("job", "junk"), OWNER, OWNER, 0o644) == errno.EPERM
    assert errno_of(jobs.create, ("job", "updates", "alice.bin"), OWNER, OWNER, 0o644) \
        == errno.EPERM
    assert errno_of(jobs.unlink, ("job", "config"), OWNER) == errno.EPERM
    assert errno_of(jobs.rmdir, ("job",), 2001) == errno.EACCES
    jobs.rmdir(("job",), OWNER)
    assert jobs.readdir(()) == []
    assert errno_of(jobs.getattr, ("job",)) == errno.ENOENT


def test_bad_config_is_einval_and_changes_nothing():
    jobs = FederatedJobs(MemoryKV())
    new_job(jobs)
    before = jobs.read(("job", "config"))
    assert errno_of(jobs.write, ("job", "config"), b"clip_norm = -1\nmode = secure", OWNER) \
        == errno.EINVAL
    assert jobs.read(("job", "config")) == before
    jobs.write(("job", "config"), b"clip_norm = 2", OWNER)
    assert b"clip_norm = 2" in jobs.read(("job", "config"))


def test_round_applies_mean_of_clipped_updates():
    jobs = FederatedJobs(MemoryKV())
    p = new_job(jobs, config="clients = alice,bob,carol\nnoise_multiplier = 0\n"
                             "clip_norm = 1\nlearning_rate = 0.5\n")
    ds = {"alice": delta(1, scale=0.01), "bob": delta(2, scale=10.0), "carol": delta(3, scale=0.02)}
    for c, d in ds.items():
        upload(jobs, "job", c, plain_update(d, 0))
    new, meta = current(jobs, "job")
    assert meta["round"] == "1" and jobs.read(("job", "round")) == b"1\n"
    want = {k: p[k].astype(np.float64) + 0.5 * np.mean(
        [clip_gradients({kk: v.astype(np.float64) for kk, v in d.items()}, 1.0)[k]
         for d in ds.values()], axis=0) for k in p}
    for k in p:
        assert new[k].dtype == np.float32
        assert np.allclose(new[k], want[k], atol=1e-6)
    assert jobs.readdir(("job", "updates")) == []
    assert "round=1 mode=plain clients=3/3" in jobs.read(("job", "history")).decode()


def test_server_noise_has_the_configured_scale():
    shapes = {"w": (400, 100)}
    jobs = FederatedJobs(MemoryKV())
    p = new_job(jobs, config="clients = 4\nnoise_multiplier = 1.5\nclip_norm = 2\n"
                             "learning_rate = 1\nseed = 7\n", params=params0(shapes, np.float64))
    for i in range(4):
        upload(jobs, "job", f"c{i}", plain_update({"w": np.zeros((400, 100))}, 0))
    new, _ = current(jobs, "job")
    noise = new["w"] - p["w"]
    sigma = 1.5 * 2 / 4            # z * C / clients, on the mean
    assert np.std(noise) == pytest.approx(sigma, rel=0.03)   # 40k draws: se 0.35%
    assert abs(np.mean(noise)) < 0.02 * sigma


def test_missing_client_does_not_apply():
    jobs = FederatedJobs(MemoryKV())
    p = new_job(jobs)
    upload(jobs, "job", "alice", plain_update(delta(1), 0))
    upload(jobs, "job", "bob", plain_update(delta(2), 0))
    assert jobs.read(("job", "round")) == b"0\n"
    assert np.array_equal(current(jobs, "job")[0]["w"], p["w"])
    status = jobs.read(("job", "status")).decode()
    assert "missing carol" in status and "received 2" in status
    # the trigger needs min_clients (default: all)
    assert errno_of(jobs.write, ("job", "aggregate"), b"1", OWNER) == errno.EAGAIN
    assert errno_of(jobs.write, ("job", "aggregate"), b"yes", OWNER) == errno.EINVAL
    assert jobs.read(("job", "round")) == b"0\n"
    # lowering min_clients is pending (updates are in) and applies from the next round
    jobs.write(("job", "config"), b"min_clients = 2", OWNER)
    assert errno_of(jobs.write, ("job", "aggregate"), b"1", OWNER) == errno.EAGAIN
    # withdrawing the pending updates lets the config apply at once
    jobs.unlink(("job", "updates", "alice.safetensors"), OWNER)
    jobs.unlink(("job", "updates", "bob.safetensors"), OWNER)
    assert b"min_clients = 2" in jobs.read(("job", "config"))
    upload(jobs, "job", "alice", plain_update(delta(1), 0))
    upload(jobs, "job", "bob", plain_update(delta(2), 0))
    jobs.write(("job", "aggregate"), b"1\n", OWNER)
    assert jobs.read(("job", "round")) == b"1\n"
    assert "clients=2/3" in jobs.read(("job", "history")).decode()


def test_refusals_have_the_right_errno_and_lose_nothing():
    jobs = FederatedJobs(MemoryKV())
    p = new_job(jobs)
    good = delta(1)
    upload(jobs, "job", "alice", plain_update(good, 0), uid=2001)
    # duplicate for the round
    assert errno_of(upload, jobs, "job", "alice", plain_update(delta(9), 0), 2001) == errno.EEXIST
    # late (and early) updates
    assert errno_of(upload, jobs, "job", "bob", plain_update(delta(2), 3)) == errno.ESTALE
    # malformed: not safetensors, wrong names, shapes, dtypes, no round, not finite
    bad = {
        "garbage": b"this is not a safetensors file",
        "names": plain_update({"w": good["w"]}, 0),
        "shape": plain_update({"w": np.zeros((5, 8), np.float32), "b": good["b"]}, 0),
        "dtype": plain_update({"w": good["w"].astype(np.float64), "b": good["b"]}, 0),
        "no round": st_save(good),
        "nan": plain_update({"w": good["w"] * np.nan, "b": good["b"]}, 0),
        "truncated": plain_update(good, 0)[:-7],
        "wrong client": plain_update(good, 0, client="alice"),
        "wrong mode": st_save(good, {"round": "0", "encoding": "secure"}),
        "empty": b"",
    }
    for why, data in bad.items():
        assert errno_of(upload, jobs, "job", "bob", data) == errno.EINVAL, why
    # unknown client; a client name held by another uid
    assert errno_of(upload, jobs, "job", "mallory", plain_update(good, 0)) == errno.EACCES
    jobs.unlink(("job", "updates", "alice.safetensors"), 2001)
    assert errno_of(upload, jobs, "job", "alice", plain_update(good, 0), 2002) == errno.EACCES
    upload(jobs, "job", "alice", plain_update(good, 0), uid=2001)
    # a refused name leaves nothing behind
    assert jobs.readdir(("job", "updates")) == ["alice.safetensors"]
    status = jobs.read(("job", "status")).decode()
    assert "refused 14\n" in status and "received 1\n" in status     # each one counted
    # nothing lost: the round completes with alice's first update
    upload(jobs, "job", "bob", plain_update(delta(2), 0))
    upload(jobs, "job", "carol", plain_update(delta(3), 0))
    new, _ = current(jobs, "job")
    want = p["w"].astype(np.float64) + np.mean([good["w"], delta(2)["w"], delta(3)["w"]], axis=0)
    assert np.allclose(new["w"], want, atol=1e-6)
    # now alice's round-0 update is late
    assert errno_of(upload, jobs, "job", "alice", plain_update(good, 0), 2001) == errno.ESTALE
    # params cannot be replaced while a round has updates
    upload(jobs, "job", "alice", plain_update(good, 1), uid=2001)
    assert errno_of(jobs.write, ("job", "params.safetensors"), st_save(p), OWNER) == errno.EBUSY


def test_count_mode_binds_names():
    jobs = FederatedJobs(MemoryKV())
    new_job(jobs, config="clients = 2\nnoise_multiplier = 0\n")
    upload(jobs, "job", "x", plain_update(delta(1), 0), uid=3001)
    upload(jobs, "job", "y", plain_update(delta(2), 0), uid=3002)
    assert jobs.read(("job", "round")) == b"1\n"
    assert errno_of(upload, jobs, "job", "z", plain_update(delta(3), 1), 3003) == errno.EACCES
    assert errno_of(upload, jobs, "job", "x", plain_update(delta(3), 1), 3002) == errno.EACCES


def _clients(jobs, names, job="job", uid0=4000):
    return {n: FedClient(n, InprocTransport(jobs, job, uid=uid0 + i, gid=uid0 + i), job,
                         rng=100 + i, key_seed=bytes([50 + i]) * 32)
            for i, n in enumerate(names)}


def test_secure_round_equals_plain_mean_and_needs_everyone():
    jobs = FederatedJobs(MemoryKV())
    names = ["alice", "bob", "carol"]
    p = new_job(jobs, config="clients = alice,bob,carol\nnoise_multiplier = 0\nmode = secure\n"
                             "clip_norm = 100\n")
    cl = _clients(jobs, names)
    ds = {n: delta(i, scale=1.0) for i, n in enumerate(names)}
    # no keys yet: EAGAIN
    params, rnd = cl["alice"].params()
    with pytest.raises(FedError) as ei:
        cl["alice"].submit(params, ds["alice"], rnd, peers={})
    assert ei.value.errno in (errno.EAGAIN, errno.EINVAL)
    for c in cl.values():
        c.publish_key()
    cl["alice"].publish_key()                          # the same key again: a no-op
    assert errno_of(jobs.write, ("job", "keys", "alice.pub"),
                    generate_keypair(b"\x66" * 32)[1].hex().encode(), 4000) == errno.EEXIST
    assert jobs.readdir(("job", "keys")) == ["alice.pub", "bob.pub", "carol.pub"]
    cl["alice"].submit(params, ds["alice"], rnd)
    cl["bob"].submit(params, ds["bob"], rnd)
    # a missing participant: the trigger refuses (masks do not cancel)
    jobs.write(("job", "config"), b"min_clients = 1", OWNER)     # pending: updates are in
    assert errno_of(jobs.write, ("job", "aggregate"), b"1", OWNER) == errno.EAGAIN
    # keys cannot change under masked updates
    assert errno_of(jobs.unlink, ("job", "keys", "carol.pub"), OWNER) == errno.EBUSY
    # an update masked against another key set is refused
    other = dict(cl["carol"].peers())
    other["bob"] = generate_keypair(b"\x77" * 32)[1]
    bad = make_update(params, ds["carol"], rnd, cl["carol"].config(), client="carol",
                      job="job", private_key=cl["carol"].private_key, peers=other)
    assert errno_of(upload, jobs, "job", "carol", bad, 4002) == errno.EINVAL
    assert jobs.read(("job", "round")) == b"0\n"
    cl["carol"].submit(params, ds["carol"], rnd)
    new, meta = current(jobs, "job")
    assert meta["round"] == "1"
    for k in p:
        want = p[k].astype(np.float64) + np.mean([ds[n][k].astype(np.float64) for n in names], axis=0)
        assert np.allclose(new[k], want, atol=1e-6)


def test_secure_noise_shares_sum_to_the_configured_scale():
    shapes = {"w": (200, 100)}
    jobs = FederatedJobs(MemoryKV())
    names = [f"c{i}" for i in range(4)]
    p = new_job(jobs, config="clients = c0,c1,c2,c3\nnoise_multiplier = 2\nclip_norm = 0.5\n"
                             "mode = secure\n", params=params0(shapes, np.float64))
    cl = _clients(jobs, names)
    for c in cl.values():
        c.publish_key()
    for c in cl.values():
        params, rnd = c.params()
        c.submit(params, {"w": np.zeros((200, 100))}, rnd)
    new, _ = current(jobs, "job")
    assert np.std(new["w"] - p["w"]) == pytest.approx(2 * 0.5 / 4, rel=0.03)
    assert "epsilon " in jobs.read(("job", "privacy")).decode()


@pytest.mark.skipif(not fed.HE_AVAILABLE, reason="tenseal is not installed: mode he unavailable")
def test_he_sum_equals_plain_sum():
    jobs = FederatedJobs(MemoryKV())
    names = ["alice", "bob", "carol"]
    shapes = {"w": (70, 70), "b": (10,)}      # 4910 values: two CKKS chunks
    p = new_job(jobs, config="clients = alice,bob,carol\nnoise_multiplier = 0\nmode = he\n"
                             "clip_norm = 100\n", params=params0(shapes))
    secret, public = he_keygen()
    cl = _clients(jobs, names)
    params, rnd = cl["alice"].params()
    ds = {n: delta(i, shapes, scale=0.5) for i, n in enumerate(names)}
    with pytest.raises(FedError) as ei:
        upload(jobs, "job", "alice", st_save({"ckks.0000": np.zeros(3, np.uint8)},
                                             {"round": "0", "encoding": "he", "n": "4910"}))
    assert ei.value.errno == errno.EAGAIN                  # no context yet
    assert errno_of(jobs.write, ("job", "he", "context"),
                    secret.serialize(save_secret_key=True), OWNER) == errno.EINVAL
    jobs.write(("job", "he", "context"), public, OWNER)
    assert errno_of(upload, jobs, "job", "alice",
                    st_save({"ckks.0000": np.zeros(3, np.uint8), "ckks.0001": np.zeros(3, np.uint8)},
                            {"round": "0", "encoding": "he", "n": "4910"})) == errno.EINVAL
    for n in names:
        cl[n].submit(params, ds[n], rnd)
    assert jobs.readdir(("job", "he")) == ["context", "decrypted.safetensors", "sum"]
    assert "phase awaiting_decryption" in jobs.read(("job", "status")).decode()
    assert jobs.read(("job", "round")) == b"0\n"
    he_sum = jobs.read(("job", "he", "sum"))
    dec = decrypted_sum_bytes(secret, he_sum, params)
    total, _ = st_load(dec)
    for k in shapes:
        plain = sum(ds[n][k].astype(np.float64) for n in names)
        assert np.allclose(total[k], plain, atol=1e-5)
    assert errno_of(jobs.write, ("job", "he", "decrypted.safetensors"),
                    st_save(total, {"round": "5"}), OWNER) == errno.ESTALE
    jobs.write(("job", "he", "decrypted.safetensors"), dec, OWNER)
    new, meta = current(jobs, "job")
    assert meta["round"] == "1" and "sum" not in jobs.readdir(("job", "he"))
    for k in shapes:
        want = p[k] + sum(ds[n][k].astype(np.float64) for n in names) / 3
        assert np.allclose(new[k], want, atol=1e-5)


def test_privacy_file_grows_and_matches_the_accountant():
    pytest.importorskip("dp_accounting")
    from dp_accounting import dp_event, rdp
    jobs = FederatedJobs(MemoryKV())
    new_job(jobs, config="clients = 2\nnoise_multiplier = 1.3\ndelta = 1e-6\nseed = 1\n")
    eps = []
    for r in range(4):
        for c in ("a", "b"):
            upload(jobs, "job", c, plain_update(delta(r), r), uid=5000)
        text = jobs.read(("job", "privacy")).decode()
        fields = dict(line.split(" ", 1) for line in text.splitlines())
        assert fields["rounds"] == str(r + 1) and fields["sampling_rate"] == "1"
        eps.append(float(fields["epsilon"]))
    assert all(a < b for a, b in zip(eps, eps[1:]))
    acc = rdp.RdpAccountant()
    acc.compose(dp_event.GaussianDpEvent(1.3), 4)
    assert eps[-1] == pytest.approx(acc.get_epsilon(1e-6), rel=1e-5)


@pytest.mark.parametrize("kind", kv_kinds())
def test_restart_keeps_everything(kind, tmp_path):
    kv = make_kv(kind, tmp_path)
    jobs = FederatedJobs(kv)
    p = new_job(jobs)
    upload(jobs, "job", "alice", plain_update(delta(1), 0), uid=2001)
    upload(jobs, "job", "bob", plain_update(delta(2), 0), uid=2002)
    jobs.write(("job", "config"), b"clip_norm = 3", OWNER)           # pending
    kv.put("fed/job/updates/0/zombie", b"an orphan a crash left")   # dropped at restore
    jobs2 = FederatedJobs(kv)
    assert "fed/job/updates/0/zombie" not in kv.keys("fed/")
    assert jobs2.readdir(("job", "updates")) == ["alice.safetensors", "bob.safetensors"]
    assert jobs2.getattr(("job", "updates", "alice.safetensors"))["uid"] == 2001
    assert b"#   clip_norm = 3" in jobs2.read(("job", "config"))
    assert errno_of(upload, jobs2, "job", "alice", plain_update(delta(1), 0), 2001) == errno.EEXIST
    upload(jobs2, "job", "carol", plain_update(delta(3), 0))
    new, meta = current(jobs2, "job")
    want = p["w"].astype(np.float64) + np.mean([delta(i)["w"] for i in (1, 2, 3)], axis=0)
    assert meta["round"] == "1" and np.allclose(new["w"], want, atol=1e-6)
    assert b"clip_norm = 3" in jobs2.read(("job", "config"))       # applied with the round
    jobs3 = FederatedJobs(kv)
    assert jobs3.read(("job", "params.safetensors")) == jobs2.read(("job", "params.safetensors"))
    assert jobs3.read(("job", "history")) == jobs2.read(("job", "history"))
    # no update, no old params generation is left in the store
    assert [k.split("/")[2] for k in kv.keys("fed/")] == ["history", "meta", "params"]


class FlakyKV(MemoryKV):
    """Fails puts of params while armed: a round that cannot be stored."""
    armed = False

    def put(self, key, data):
        if self.armed and "/params/" in key:
            raise OSError(errno.ENOSPC, "disk full")
        super().put(key, data)


def test_failed_round_loses_nothing_and_resumes():
    kv = FlakyKV()
    jobs = FederatedJobs(kv)
    p = new_job(jobs)
    kv.armed = True
    for i, c in enumerate(("alice", "bob", "carol")):
        upload(jobs, "job", c, plain_update(delta(i), 0))    # the last write still succeeds
    assert jobs.read(("job", "round")) == b"0\n"
    assert np.array_equal(current(jobs, "job")[0]["w"], p["w"])
    assert "disk full" in jobs.read(("job", "status")).decode()
    assert len(jobs.readdir(("job", "updates"))) == 3
    assert errno_of(jobs.write, ("job", "aggregate"), b"1", OWNER) == errno.EIO
    kv.armed = False
    jobs2 = FederatedJobs(kv)                   # a restart: the round is complete
    assert jobs2.resume() == ["job"]
    assert jobs2.read(("job", "round")) == b"1\n"
    # or, without a restart, the trigger retries
    kv.armed = True
    for i, c in enumerate(("alice", "bob", "carol")):
        upload(jobs2, "job", c, plain_update(delta(i), 1))
    kv.armed = False
    jobs2.write(("job", "aggregate"), b"1", OWNER)
    assert jobs2.read(("job", "round")) == b"2\n"


def test_secure_sum_out_of_bound_is_not_applied():
    jobs = FederatedJobs(MemoryKV())
    names = ["alice", "bob"]
    p = new_job(jobs, config="clients = alice,bob\nnoise_multiplier = 0\nmode = secure\n"
                             "clip_norm = 1\n")
    cl = _clients(jobs, names)
    for c in cl.values():
        c.publish_key()
    params, rnd = cl["alice"].params()
    peers = cl["alice"].peers()
    cfg = cl["alice"].config()
    # a client that does not clip: an update far beyond clip_norm
    cfg_noclip = dict(cfg, clip_norm=1e6)
    for n in names:
        data = make_update(params, delta(1, scale=1000.0), rnd, cfg_noclip, client=n,
                           job="job", private_key=cl[n].private_key, peers=peers)
        upload(jobs, "job", n, data, cl[n].t.uid)
    assert jobs.read(("job", "round")) == b"0\n"
    assert "did not cancel or a client did not clip" in jobs.read(("job", "status")).decode()
    assert len(jobs.readdir(("job", "updates"))) == 2
    assert np.array_equal(current(jobs, "job")[0]["w"], p["w"])


def test_concurrent_clients_one_round_each():
    jobs = FederatedJobs(MemoryKV())
    names = [f"c{i}" for i in range(8)]
    new_job(jobs, config="clients = " + ",".join(names) + "\nnoise_multiplier = 0\n")
    seen = []
    jobs.notify = lambda paths: seen.extend(paths)
    errors = []

    def client(i):
        try:
            for r in range(3):
                while True:
                    raw, meta = current(jobs, "job")
                    if int(meta["round"]) == r:
                        break
                upload(jobs, "job", names[i], plain_update(delta(10 * r + i), r), 6000 + i)
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errors
    assert jobs.read(("job", "round")) == b"3\n"
    assert len(jobs.read(("job", "history")).splitlines()) == 3
    assert ("job", "params.safetensors") in seen and ("job", "round") in seen


def test_open_time_checks_and_write_modes():
    jobs = FederatedJobs(MemoryKV())
    new_job(jobs)
    for name in ("round", "status", "privacy", "history"):
        assert errno_of(jobs.check_open, ("job", name), 0, True) == errno.EACCES   # even root
        jobs.check_open(("job", name), 2001, False)
    assert errno_of(jobs.check_open, ("job", "config"), 2001, True) == errno.EACCES
    jobs.check_open(("job", "config"), OWNER, True)
    jobs.check_open(("job", "aggregate"), 0, True)
    assert errno_of(jobs.check_open, ("job", "updates"), OWNER, True) == errno.EISDIR
    upload(jobs, "job", "alice", plain_update(delta(1), 0), uid=2001)
    assert errno_of(jobs.check_open, ("job", "updates", "alice.safetensors"), 2001, True) \
        == errno.EEXIST
    assert errno_of(jobs.check_open, ("job", "updates", "alice.safetensors"), 0, False) \
        == errno.EACCES
    assert jobs.write_mode(("job", "config")) == "each"
    assert jobs.write_mode(("job", "aggregate")) == "each"
    assert jobs.write_mode(("job", "keys", "bob.pub")) == "each"
    assert jobs.write_mode(("job", "params.safetensors")) == "close"
    assert jobs.write_mode(("job", "updates", "bob.safetensors")) == "close"
    # a key's text applied again at the next write() is a no-op; another key is EEXIST
    _, pub = generate_keypair(b"\x01" * 32)
    parts = ("job", "keys", "bob.pub")
    jobs.create(parts, 2002, 2002, 0o644)
    jobs.write(parts, pub.hex().encode(), 2002)
    jobs.write(parts, (pub.hex() + "\n").encode(), 2002)
    assert errno_of(jobs.write, parts, generate_keypair(b"\x02" * 32)[1].hex().encode(),
                    2002) == errno.EEXIST
    assert jobs.read(parts) == (pub.hex() + "\n").encode()
    # a failed create+write leaves no name behind
    parts = ("job", "keys", "carol.pub")
    jobs.create(parts, 2003, 2003, 0o644)
    assert jobs.readdir(("job", "keys")) == ["bob.pub", "carol.pub"]
    assert errno_of(jobs.write, parts, b"not a key", 2003) == errno.EINVAL
    assert jobs.readdir(("job", "keys")) == ["bob.pub"]
