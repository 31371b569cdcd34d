"""A job's rounds: which updates a round takes, and how it is aggregated and committed.

Owns: Rounds, over a JobStore: the validation of an update against the job (round,
client, encoding, tensor names, shapes and dtypes, the secure round's key set, the
CKKS chunks of mode he), when a round is complete, the aggregation (plain: clip every
update and add the central noise; secure: the masked sum in Z/2^64, checked against a
norm bound; he: the sum of ciphertexts under the owner's he/context, published as
he/sum and applied when the owner writes he/decrypted.safetensors), the commit of a
round (the new params generation, the history line, the privacy spent), config changes
that wait for a round boundary, and resume() after a restart.

Threads: aggregate() checks and snapshots under the job's lock, computes without it
(j.busy keeps other writers out), and commits under it again; it calls `changed(paths)`
outside any lock.

May call: state, tree (names and limits only), config, crypto, tensors, errors, numpy.
Nothing of engine.
"""

from __future__ import annotations

import errno
import math
import time
from typing import Any, Callable, Optional

import numpy as np

from memosfs.federated.config import expected_count, fmt_epsilon, named_clients
from memosfs.federated.crypto import (HE_AVAILABLE, HE_SLOTS, he_chunks, he_context, he_pack,
                                      peers_digest, tenseal)
from memosfs.federated.errors import FedError, log, refuse_job
from memosfs.federated.state import Entry, Job, JobStore, now_ns
from memosfs.federated.tensors import (FRAC_BITS, clip_gradients, decode_fixed, make_rng,
                                       st_load, st_save)
from memosfs.federated.tree import HISTORY_MAX, UPDATE_SUFFIX


class Rounds:
    """Validation, aggregation and commit of a job's rounds.  The methods that take a
    job expect its lock held, except aggregate(), write_decrypted() and resume(),
    which take it themselves."""

    def __init__(self, store: JobStore,
                 changed: Callable[[list[tuple[str, ...]]], None]) -> None:
        self.store = store
        self.changed = changed

    def resume(self) -> list[str]:
        """Aggregate every job whose round has all its updates (a restart between the
        last update and the commit).  Returns the jobs that advanced."""
        done = []
        for name in list(self.store.jobs):
            j = self.store.jobs.get(name)
            if j is None:
                continue
            with j.lock:
                ready = (j.phase == "collecting" and not j.busy and
                         self.complete(j))
            if ready:
                try:
                    r0 = j.round
                    self.aggregate(j, trigger=False)
                    if j.round != r0 or j.phase != "collecting":
                        done.append(name)
                except FedError:
                    pass
        return done

    # ------------------------------------------------------------ who a round waits for

    def complete(self, j: Job) -> bool:
        names = named_clients(j.config)
        if names is not None:
            return all(n in j.updates for n in names)
        return len(j.updates) >= expected_count(j.config)

    def secure_peers(self, j: Job) -> dict[str, bytes]:
        names = named_clients(j.config)
        if names is None:
            names = sorted(j.keys)
            if len(names) != expected_count(j.config):
                raise FedError(errno.EAGAIN, f"waiting for keys ({len(names)} of "
                                             f"{expected_count(j.config)})")
        missing = [n for n in names if n not in j.keys]
        if missing:
            raise FedError(errno.EAGAIN, "waiting for keys of " + ", ".join(missing))
        return {n: self.store.public_key(j, n) for n in names}

    def set_config(self, j: Job, cfg: dict[str, Any]) -> None:
        old = j.config
        j.config, j.pending_config = cfg, None
        j.epsilon()        # here, in the writer's thread, not in a later getattr
        if cfg["clients"] != old["clients"]:
            # bindings of clients no longer expected are forgotten
            names = cfg["clients"] if isinstance(cfg["clients"], list) else None
            if names is not None:
                j.bindings = {k: v for k, v in j.bindings.items() if k in names}

    def maybe_apply_pending(self, j: Job) -> list[tuple[str, ...]]:
        if (j.pending_config is not None and not j.updates and not j.busy
                and j.phase == "collecting"):
            self.set_config(j, j.pending_config)
            self.store.put_meta(j)
            return [(j.name, "config"), (j.name, "privacy")]
        return []

    # ------------------------------------------------------------ validation

    def validate_update(self, j: Job, client: str, data: bytes) -> dict[str, np.ndarray]:
        """Check an update against the job; FedError (logged) if it is refused."""
        try:
            tensors, meta = st_load(data)
        except ValueError as e:
            raise refuse_job(j, errno.EINVAL, "update of %s: not safetensors: %s",
                             client, e) from None
        r = meta.get("round")
        if r is None or not r.lstrip("-").isdigit():
            raise refuse_job(j, errno.EINVAL, "update of %s: metadata names no round",
                             client)
        if int(r) != j.round:
            raise refuse_job(j, errno.ESTALE, "update of %s is for round %s; the job "
                             "is at round %d", client, r, j.round)
        if meta.get("client", client) != client:
            raise refuse_job(j, errno.EINVAL, "update of %s says it is from %s",
                             client, meta.get("client"))
        mode = j.config["mode"]
        enc = meta.get("encoding", "plain")
        if enc != mode:
            raise refuse_job(j, errno.EINVAL, "update of %s is %s; the job's mode is %s",
                             client, enc, mode)
        params = self.store.params_tensors(j)
        if mode == "he":
            ctx = self.he_ctx(j)
            try:
                chunks = he_chunks(tensors)
                n = int(meta.get("n", "-1"))
            except ValueError as e:
                raise refuse_job(j, errno.EINVAL, "update of %s: %s", client, e) from None
            total = sum(a.size for a in params.values())
            want = max(1, -(-total // HE_SLOTS))
            if n != total or len(chunks) != want:
                raise refuse_job(j, errno.EINVAL, "update of %s: %d values in %d chunks; "
                                 "the params have %d (%d chunks)", client, n, len(chunks),
                                 total, want)
            for i, c in enumerate(chunks):
                try:
                    v = tenseal().ckks_vector_from(ctx, c)
                except Exception as e:
                    raise refuse_job(j, errno.EINVAL, "update of %s: chunk %d is not a "
                                     "CKKS vector of this job's context (%s)", client, i,
                                     e) from None
                size = min(HE_SLOTS, total - i * HE_SLOTS)
                if v.size() != size:
                    raise refuse_job(j, errno.EINVAL, "update of %s: chunk %d holds %d "
                                     "values, not %d", client, i, v.size(), size)
            return tensors
        if sorted(tensors) != sorted(params):
            raise refuse_job(j, errno.EINVAL, "update of %s: tensors %s; the params have %s",
                             client, sorted(tensors)[:8], sorted(params)[:8])
        for k, p in params.items():
            a = tensors[k]
            if tuple(a.shape) != tuple(p.shape):
                raise refuse_job(j, errno.EINVAL, "update of %s: tensor %s is %s, not %s",
                                 client, k, tuple(a.shape), tuple(p.shape))
            want_dt = np.uint64 if mode == "secure" else p.dtype
            if a.dtype != want_dt:
                raise refuse_job(j, errno.EINVAL, "update of %s: tensor %s is %s, not %s",
                                 client, k, a.dtype, np.dtype(want_dt))
            if mode == "plain" and not np.all(np.isfinite(a)):
                raise refuse_job(j, errno.EINVAL, "update of %s: tensor %s not finite",
                                 client, k)
        if mode == "secure":
            if meta.get("frac_bits") != str(FRAC_BITS):
                raise refuse_job(j, errno.EINVAL, "update of %s: frac_bits %s, not %d",
                                 client, meta.get("frac_bits"), FRAC_BITS)
            try:
                peers = self.secure_peers(j)
            except FedError as e:
                raise refuse_job(j, e.errno, "update of %s: %s", client, e.strerror) from None
            if meta.get("peers") != peers_digest(peers):
                raise refuse_job(j, errno.EINVAL, "update of %s was masked against another "
                                 "set of keys than the round's (%s)", client,
                                 ", ".join(sorted(peers)))
            if client not in peers:
                raise refuse_job(j, errno.EACCES, "update of %s: no key registered", client)
        return tensors

    def he_ctx(self, j: Job):
        if not HE_AVAILABLE:
            raise refuse_job(j, errno.EOPNOTSUPP, "mode he needs tenseal")
        if j.he_context is None:
            raise refuse_job(j, errno.EAGAIN, "mode he: the owner has not written "
                             "he/context yet")
        cached = j.he_ctx_cache
        if cached is None or cached[0] != j.he_context.mtime_ns:
            ctx = he_context(self.store.kv.get(self.store.key(j.name, "he/context")) or b"")
            j.he_ctx_cache = cached = (j.he_context.mtime_ns, ctx)
        return cached[1]

    def write_he_context(self, j: Job, data: bytes) -> None:
        """he/context, written by the owner: a public TenSEAL context (no secret key),
        refused while a round holds updates encrypted under the previous one."""
        if not HE_AVAILABLE:
            raise refuse_job(j, errno.EOPNOTSUPP, "he/context: tenseal is not installed")
        try:
            ctx = he_context(data)
        except Exception as e:
            raise refuse_job(j, errno.EINVAL, "he/context: not a TenSEAL context (%s)",
                             e) from None
        if ctx.is_private():
            raise refuse_job(j, errno.EINVAL, "he/context holds the secret key; write the "
                             "public context only")
        with j.lock:
            if j.busy or j.phase != "collecting" or (j.config["mode"] == "he" and j.updates):
                raise refuse_job(j, errno.EBUSY, "he/context: round %d has encrypted "
                                 "updates", j.round)
            self.store.kv.put(self.store.key(j.name, "he/context"), data)
            j.he_context = Entry(j.owner, j.gid, now_ns(), len(data))
            j.he_ctx_cache = (j.he_context.mtime_ns, ctx)
            self.store.put_meta(j)
        self.changed([(j.name, "he", "context"), (j.name, "status")])

    # ------------------------------------------------------------ aggregation

    def aggregate(self, j: Job, trigger: bool) -> None:
        """Aggregate the current round: phase 1 under the lock (checks, snapshot),
        the arithmetic without it, the commit under it again."""
        with j.lock:
            if j.busy:
                raise refuse_job(j, errno.EBUSY, "round %d is already being aggregated",
                                 j.round)
            if j.phase != "collecting":
                raise refuse_job(j, errno.EBUSY, "round %d awaits decryption of he/sum",
                                 j.round)
            if not j.params_gen:
                raise refuse_job(j, errno.EAGAIN, "aggregate: the job has no params")
            cfg = dict(j.config)
            mode = cfg["mode"]
            n = expected_count(cfg)
            m = len(j.updates)
            if not self.complete(j):
                need = cfg["min_clients"] or n
                if mode == "secure":
                    raise refuse_job(j, errno.EAGAIN, "aggregate: mode secure needs every "
                                     "participant (masks cancel only in the full sum): "
                                     "%d of %d updates", m, n)
                if not trigger or m < need:
                    raise refuse_job(j, errno.EAGAIN, "aggregate: %d of %d updates (at "
                                     "least %d needed)", m, n, need)
            if m == 0:
                raise refuse_job(j, errno.EAGAIN, "aggregate: no updates")
            clients = sorted(j.updates)
            rnd = j.round
            kv, key = self.store.kv, self.store.key
            blobs = {c: kv.get(key(j.name, f"updates/{rnd}/{c}")) for c in clients}
            params_blob = self.store.params(j)
            he_ctx = self.he_ctx(j) if mode == "he" else None
            j.busy = True
        t0 = time.perf_counter()
        try:
            if mode == "he":
                result = self.he_sum(j, he_ctx, blobs, rnd, clients, n)
            else:
                result = self.compute(j, cfg, params_blob, blobs, rnd, m, n)
        except FedError as e:
            with j.lock:
                j.busy = False
                j.last_error = f"round {rnd}: {e.strerror}"
                self.store.put_meta_quiet(j)
            raise
        except Exception as e:
            log.exception("federated: job %s: round %d failed", j.name, rnd)
            with j.lock:
                j.busy = False
                j.last_error = f"round {rnd}: {type(e).__name__}: {e}"
                self.store.put_meta_quiet(j)
            raise refuse_job(j, errno.EIO, "round %d failed: %s", rnd, e) from None
        secs = time.perf_counter() - t0
        with j.lock:
            try:
                if mode == "he":
                    changed = self.commit_he_sum(j, result, rnd, clients, secs)
                else:
                    changed = self.commit_round(j, result, rnd, clients, cfg, m, n, secs)
            except Exception as e:
                log.exception("federated: job %s: committing round %d failed", j.name, rnd)
                j.last_error = f"round {rnd}: commit failed: {e}"
                raise refuse_job(j, errno.EIO, "round %d: commit failed: %s", rnd,
                                 e) from None
            finally:
                j.busy = False
        self.changed(changed)

    def compute(self, j: Job, cfg: dict, params_blob: bytes, blobs: dict[str, bytes],
                rnd: int, m: int, n: int) -> tuple[bytes, float, float]:
        """plain / secure: the new params blob, the effective noise multiplier and the
        norm of the applied mean."""
        params, pmeta = st_load(params_blob)
        C, z, lr = cfg["clip_norm"], cfg["noise_multiplier"], cfg["learning_rate"]
        names = sorted(params)
        if cfg["mode"] == "plain":
            total = {k: np.zeros(params[k].shape, np.float64) for k in names}
            for c, blob in blobs.items():
                u, _ = st_load(blob)
                u = clip_gradients({k: u[k].astype(np.float64) for k in names}, C)
                for k in names:
                    total[k] += u[k]
            if z > 0:
                seed = cfg.get("seed")
                g = (np.random.default_rng([seed, rnd]) if seed is not None else make_rng(None))
                for k in names:
                    total[k] += g.normal(0.0, z * C, size=total[k].shape)
            z_eff = z
        else:  # secure
            acc = {k: np.zeros(params[k].shape, np.uint64) for k in names}
            for c, blob in blobs.items():
                u, _ = st_load(blob)
                for k in names:
                    acc[k] += u[k]      # wraps mod 2^64
            total = {k: decode_fixed(acc[k]) for k in names}
            norm = math.sqrt(sum(float(np.sum(t * t)) for t in total.values()))
            d = sum(t.size for t in total.values())
            bound = m * C + 8.0 * z * C * math.sqrt(d) + 1.0
            if not norm <= bound:
                raise refuse_job(j, errno.EIO, "round %d: the unmasked sum has norm %.3g, "
                                 "beyond %.3g: masks did not cancel or a client did not "
                                 "clip; round not applied, updates kept", rnd, norm, bound)
            z_eff = z
        mean = {k: total[k] / m for k in names}
        new = {k: (params[k].astype(np.float64) + lr * mean[k]).astype(params[k].dtype)
               for k in names}
        meta = dict(pmeta)
        meta.update({"round": str(rnd + 1), "job": j.name})
        norm_mean = math.sqrt(sum(float(np.sum(v * v)) for v in mean.values()))
        return st_save(new, meta), z_eff, norm_mean

    def commit_round(self, j: Job, result: tuple[bytes, float, float], rnd: int,
                     clients: list[str], cfg: dict, m: int, n: int, secs: float,
                     mode: Optional[str] = None) -> list[tuple[str, ...]]:
        blob, z_eff, norm = result
        if j.round != rnd:
            raise RuntimeError("the round moved while it was aggregated")
        self.store.commit_params(j, blob)
        old_updates = list(j.updates)
        j.updates = {}
        j.round = rnd + 1
        j.phase = "collecting"
        j.events.append(float(z_eff))
        j.last_error = ""
        eps = j.epsilon()
        mode = mode or cfg["mode"]
        sigma = cfg["noise_multiplier"] * cfg["clip_norm"] / m
        line = (f"round={rnd + 1} mode={mode} clients={m}/{n} clip_norm={cfg['clip_norm']:g} "
                f"noise_multiplier={z_eff:g} sigma_mean={sigma:.6g} "
                f"update_norm={norm:.6g} epsilon={fmt_epsilon(eps)} delta={j.config['delta']:g} "
                f"seconds={secs:.4f} time={time.strftime('%Y-%m-%dT%H:%M:%S')}")
        j.history.append(line)
        del j.history[:-HISTORY_MAX]
        self.store.kv.put(self.store.key(j.name, "history"),
                          "".join(h + "\n" for h in j.history).encode())
        he_sum = j.he_sum
        j.he_sum = None
        self.store.put_meta(j)             # the commit point of the round
        for c in old_updates:
            self.store.kv.delete(self.store.key(j.name, f"updates/{rnd}/{c}"))
        if he_sum is not None:
            self.store.kv.delete(self.store.key(j.name, f"he/sum/{he_sum['round']}"))
        self.store.drop_old_params(j)
        log.info("federated: job %s: %s", j.name, line)
        changed = [(j.name, x) for x in ("params.safetensors", "round", "privacy", "status",
                                         "history", "updates")]
        changed += [(j.name, "updates", c + UPDATE_SUFFIX) for c in old_updates]
        if he_sum is not None:
            changed += [(j.name, "he"), (j.name, "he", "sum")]
        changed += self.maybe_apply_pending(j)
        return changed

    def he_sum(self, j: Job, ctx, blobs: dict[str, bytes], rnd: int, clients: list[str],
               n: int) -> bytes:
        total = None
        count = 0
        for c in clients:
            chunks = he_chunks(st_load(blobs[c])[0])
            vecs = [tenseal().ckks_vector_from(ctx, ch) for ch in chunks]
            total = vecs if total is None else [a + b for a, b in zip(total, vecs)]
            count = sum(v.size() for v in vecs)
        meta = {"round": str(rnd), "clients": ",".join(clients), "n": str(count),
                "job": j.name, "encoding": "ckks-sum"}
        return st_save(he_pack([v.serialize() for v in total]), meta)

    def commit_he_sum(self, j: Job, blob: bytes, rnd: int, clients: list[str],
                      secs: float) -> list:
        if j.round != rnd:
            raise RuntimeError("the round moved while it was aggregated")
        self.store.kv.put(self.store.key(j.name, f"he/sum/{rnd}"), blob)
        j.he_sum = {"round": rnd, "clients": clients, "mtime_ns": now_ns(),
                    "size": len(blob), "config": dict(j.config), "seconds": secs}
        j.phase = "awaiting_decryption"
        j.mtime_ns = now_ns()
        self.store.put_meta(j)
        log.info("federated: job %s: round %d: encrypted sum of %d updates published in "
                 "he/sum; awaiting decryption by the owner", j.name, rnd, len(clients))
        return [(j.name, "he"), (j.name, "he", "sum"), (j.name, "status")]

    def write_decrypted(self, j: Job, data: bytes) -> None:
        try:
            tensors, meta = st_load(data)
        except ValueError as e:
            raise refuse_job(j, errno.EINVAL, "he/decrypted.safetensors: %s", e) from None
        with j.lock:
            if j.phase != "awaiting_decryption" or j.he_sum is None or j.busy:
                raise refuse_job(j, errno.EAGAIN, "he/decrypted.safetensors: no sum "
                                 "awaits decryption")
            rnd = j.round
            if meta.get("round") != str(rnd):
                raise refuse_job(j, errno.ESTALE, "he/decrypted.safetensors is for round "
                                 "%s; the sum awaiting is round %d", meta.get("round"), rnd)
            params, pmeta = st_load(self.store.params(j))
            if sorted(tensors) != sorted(params):
                raise refuse_job(j, errno.EINVAL, "he/decrypted.safetensors: tensors are "
                                 "not named as the params")
            for k, p in params.items():
                a = tensors[k]
                if tuple(a.shape) != tuple(p.shape) or a.dtype.kind != "f" or \
                        not np.all(np.isfinite(a)):
                    raise refuse_job(j, errno.EINVAL, "he/decrypted.safetensors: tensor %s "
                                     "is not a finite float tensor of shape %s", k,
                                     tuple(p.shape))
            cfg = dict(j.he_sum.get("config") or j.config)
            clients = list(j.he_sum["clients"])
            m, n = len(clients), expected_count(cfg)
            lr = cfg["learning_rate"]
            new = {k: (params[k].astype(np.float64) + lr * tensors[k].astype(np.float64) / m)
                   .astype(params[k].dtype) for k in params}
            pm = dict(pmeta)
            pm.update({"round": str(rnd + 1), "job": j.name})
            norm = math.sqrt(sum(float(np.sum((tensors[k] / m) ** 2)) for k in params))
            z_eff = cfg["noise_multiplier"] * math.sqrt(m / n)
            changed = self.commit_round(j, (st_save(new, pm), z_eff, norm), rnd, clients,
                                        cfg, m, n, float(j.he_sum.get("seconds", 0.0)),
                                        mode="he")
        self.changed(changed)

