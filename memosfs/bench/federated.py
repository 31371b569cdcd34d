"""`memosfs bench federated`: federated training through a job directory.

    memosfs bench federated [--inproc] [--clients 8] [--rounds 20]
                            [--modes plain,secure,he] [--clip 1.0] [--noise 1.0]
                            [--local-epochs 2] [--local-lr 0.5] [--batch 16]
                            [--delta 1e-5] [--seed 0] [--json]

Data and model: scikit-learn's bundled digits (load_digits: 1797 8x8 images, no
download), pixels / 16, a stratified 75/25 train/test split, the training part dealt
out IID to --clients clients.  The model is multinomial logistic regression (W: 64x10,
b: 10, float32 params).  Each round every client reads params.safetensors, runs
--local-epochs epochs of minibatch SGD on its shard, and sends its delta (local minus
global) as updates/<client>.safetensors, all clients at once from a thread each; the
last update makes the server aggregate (mean of the clipped updates plus Gaussian
noise, sigma = noise x clip / clients, learning_rate 1 = FedAvg).  Mode he adds the key
holder's step: the job owner reads he/sum, decrypts it, writes he/decrypted.safetensors.

Baseline, measured in the same run: centralized training on the pooled training set
(sklearn LogisticRegression, lbfgs), and the same federated run without noise
(plain_nodp).  Per mode: test accuracy after the last round, epsilon at --delta (the
job's privacy file, dp-accounting RDP), seconds per round (wall time from the clients
reading params to the new params published; mean and max), the server's aggregation
seconds (history), and the update size in bytes.

By default the job lives in a fresh mount (`memosfs` in a temporary directory,
unmounted with fusermount3 -u in a finally) under .federated/; --inproc runs the same
clients against memosfs.federated.FederatedJobs directly, without FUSE.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np

import memosfs.federated as F
from memosfs.federated.engine import FederatedJobs, MemoryKV


def add_parsers(bsub) -> None:
    p = bsub.add_parser("federated", help="federated logistic regression on digits through "
                        "a job directory: accuracy vs centralized, epsilon, time per round")
    _add_args(p)
    p.set_defaults(fn=cmd_bench_federated)


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inproc", action="store_true",
                   help="run against FederatedJobs in this process (no mount)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--modes", default="plain,secure,he",
                   help="comma-separated: plain, secure, he (he is skipped without tenseal)")
    p.add_argument("--clip", type=float, default=1.0, help="clip_norm")
    p.add_argument("--noise", type=float, default=1.0, help="noise_multiplier")
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--local-lr", type=float, default=0.5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--opts", default="", help="extra mount options (not with --inproc)")
    p.add_argument("--federated-dir", default="",
                   help="use this .federated directory of a running mount instead of "
                        "starting one (jobs named fedbench-<pid>-<label>)")
    p.add_argument("--json", action="store_true", help="print JSON only")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="memosfs bench federated")
    _add_args(p)
    return cmd_bench_federated(p.parse_args(argv))


# ---------------------------------------------------------------- data and model


def _data(clients: int, seed: int):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, stratify=y, random_state=seed)
    perm = np.random.default_rng(seed).permutation(len(Xtr))
    shards = [(Xtr[s], ytr[s]) for s in np.array_split(perm, clients)]
    return Xtr, ytr, Xte, yte, shards


def _centralized(Xtr, ytr, Xte, yte) -> tuple[float, float]:
    from sklearn.linear_model import LogisticRegression
    t0 = time.perf_counter()
    acc = float(LogisticRegression(max_iter=5000).fit(Xtr, ytr).score(Xte, yte))
    return acc, time.perf_counter() - t0


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _local_delta(params: dict[str, np.ndarray], X, y, epochs: int, lr: float, batch: int,
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    W = params["W"].astype(np.float64)
    b = params["b"].astype(np.float64)
    W0, b0 = W.copy(), b.copy()
    Y = np.eye(W.shape[1])[y]
    for _ in range(epochs):
        idx = rng.permutation(len(X))
        for i in range(0, len(X), batch):
            j = idx[i:i + batch]
            G = _softmax(X[j] @ W + b) - Y[j]
            W -= lr * X[j].T @ G / len(j)
            b -= lr * G.mean(axis=0)
    return {"W": W - W0, "b": b - b0}


def _accuracy(params: dict[str, np.ndarray], Xte, yte) -> float:
    return float(np.mean((Xte @ params["W"] + params["b"]).argmax(axis=1) == yte))


# ---------------------------------------------------------------- one run


def _wait(pred: Callable[[], bool], timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.002)


def run_job(mode: str, noise: float, args, data, owner, client_transport,
            job: str) -> dict[str, Any]:
    """One federated training run in a job that `owner` (a transport) has just made;
    client_transport(i) gives client i its transport."""
    Xtr, ytr, Xte, yte, shards = data
    n = len(shards)
    names = [f"client{i:02d}" for i in range(n)]
    owner.write("config", (f"clients = {','.join(names)}\nmode = {mode}\n"
                           f"clip_norm = {args.clip}\nnoise_multiplier = {noise}\n"
                           f"learning_rate = 1\ndelta = {args.delta}\n"
                           f"seed = {args.seed}\n").encode())
    init = {"W": np.zeros((Xtr.shape[1], 10), np.float32), "b": np.zeros(10, np.float32)}
    owner.write("params.safetensors", F.st_save(init))
    secret = None
    if mode == "he":
        secret, public = F.he_keygen()
        owner.write("he/context", public)
    clients = [F.FedClient(nm, client_transport(i), job, rng=args.seed * 1000 + i)
               for i, nm in enumerate(names)]
    if mode == "secure":
        for c in clients:
            c.publish_key()
    cfg = clients[0].config()
    peers = clients[0].peers() if mode == "secure" else None
    rngs = [np.random.default_rng([args.seed, 7, i]) for i in range(n)]

    def step(i: int, r: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        c = clients[i]
        params, rnd = c.params()
        if rnd != r:
            raise RuntimeError(f"{c.name} read params of round {rnd}, expected {r}")
        d = _local_delta(params, *shards[i], args.local_epochs, args.local_lr, args.batch,
                         rngs[i])
        size = c.submit(params, d, rnd, config=cfg, peers=peers)
        return time.perf_counter() - t0, size

    def round_now() -> int:
        return int(owner.read("round").decode().strip() or "0")

    times, client_s, decrypt_s, sizes = [], [], [], []
    with cf.ThreadPoolExecutor(max_workers=n) as ex:
        for r in range(args.rounds):
            t0 = time.perf_counter()
            results = list(ex.map(lambda i: step(i, r), range(n)))
            client_s.append(max(x[0] for x in results))
            sizes.append(results[0][1])
            if mode == "he":
                _wait(lambda: owner.exists("he/sum"), what="he/sum")
                td = time.perf_counter()
                params, _ = clients[0].params()
                dec = F.decrypted_sum_bytes(secret, owner.read("he/sum"), params)
                owner.write("he/decrypted.safetensors", dec)
                decrypt_s.append(time.perf_counter() - td)
            _wait(lambda: round_now() == r + 1, what=f"round {r + 1}")
            times.append(time.perf_counter() - t0)
    final, meta = F.st_load(owner.read("params.safetensors"))
    privacy = dict(line.split(" ", 1) for line in owner.read("privacy").decode().splitlines())
    hist = owner.read("history").decode().splitlines()
    server_s = [float(h.split("seconds=")[1].split()[0]) for h in hist if "seconds=" in h]
    out = {
        "mode": mode, "noise_multiplier": noise, "rounds": int(meta["round"]),
        "accuracy": round(_accuracy(final, Xte, yte), 4),
        "epsilon": float(privacy["epsilon"]) if privacy["epsilon"] not in ("inf",) else None,
        "delta": args.delta,
        "round_s_mean": round(float(np.mean(times)), 4),
        "round_s_max": round(float(np.max(times)), 4),
        "client_s_mean": round(float(np.mean(client_s)), 4),
        "server_aggregate_s_mean": round(float(np.mean(server_s)), 4) if server_s else None,
        "update_bytes": sizes[-1],
    }
    if privacy["epsilon"] == "inf":
        out["epsilon"] = "inf"
    if decrypt_s:
        out["decrypt_s_mean"] = round(float(np.mean(decrypt_s)), 4)
    return out


# ---------------------------------------------------------------- the command


def cmd_bench_federated(args) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in F.MODES:
            print(f"memosfs bench federated: unknown mode {m!r}", file=sys.stderr)
            return 2
    skipped = {}
    if "he" in modes and not F.HE_AVAILABLE:
        modes.remove("he")
        skipped["he"] = "tenseal is not installed"
    data = _data(args.clients, args.seed)
    central_acc, central_s = _centralized(*data[:4])
    out: dict[str, Any] = {
        "bench": "federated", "transport": "inproc" if args.inproc else "mount",
        "dataset": "sklearn digits", "clients": args.clients, "rounds": args.rounds,
        "clip_norm": args.clip, "noise_multiplier": args.noise,
        "local_epochs": args.local_epochs, "local_lr": args.local_lr, "batch": args.batch,
        "train_samples": int(len(data[0])), "test_samples": int(len(data[2])),
        "centralized_accuracy": round(central_acc, 4), "centralized_s": round(central_s, 3),
        "results": [],
    }
    if skipped:
        out["skipped"] = skipped
    runs = [("plain", 0.0, "plain_nodp")] + [(m, args.noise, m) for m in modes]

    def run_all(make) -> None:
        for mode, noise, label in runs:
            t0 = time.perf_counter()
            owner, client_transport, job = make(label)
            res = run_job(mode, noise, args, data, owner, client_transport, job)
            res["label"] = label
            res["total_s"] = round(time.perf_counter() - t0, 3)
            out["results"].append(res)
            if not args.json:
                print(f"{label:11s} acc {res['accuracy']:.4f} (centralized "
                      f"{central_acc:.4f})  eps {res['epsilon']}  round "
                      f"{res['round_s_mean'] * 1000:.1f} ms", file=sys.stderr)

    if args.inproc:
        jobs = FederatedJobs(MemoryKV())

        def make(label):
            jobs.mkdir((label,), 0, 0, 0o755)
            return (F.InprocTransport(jobs, label), lambda i: F.InprocTransport(jobs, label),
                    label)
        run_all(make)
    else:
        def in_root(root: str, prefix: str) -> int:
            if not os.path.isdir(root):
                out["error"] = (f"{root} is missing: this mount does not serve federated "
                                "jobs (yet); use --inproc")
                print(json.dumps(out))
                return 1

            def make(label):
                job = prefix + label
                jobdir = os.path.join(root, job)
                os.mkdir(jobdir)
                return F.PathTransport(jobdir), lambda i: F.PathTransport(jobdir), job
            try:
                run_all(make)
            finally:
                for _, _, label in runs:
                    try:
                        os.rmdir(os.path.join(root, prefix + label))
                    except OSError:
                        pass
            return 0

        if args.federated_dir:
            rc = in_root(args.federated_dir, f"fedbench-{os.getpid()}-")
        else:
            from memosfs.bench.common import memos_mount
            with memos_mount(256 << 20, args.opts) as mnt:
                rc = in_root(os.path.join(mnt, ".federated"), "")
        if rc:
            return rc
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
