"""A throwaway Redis Cluster on loopback ports, for tests and benchmarks.

    with LocalCluster(masters=3, replicas=1) as c:   # 3 masters + 3 replicas
        c.url                   # redis://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
        c.master_for(b"key")    # the port that serves a key now
        c.kill(port)            # SIGKILL one node (fault tests); c.pause/resume: SIGSTOP/SIGCONT

    with LocalCluster(tls=True, admin_password="pw") as c:   # TLS only (port 0), TLS bus
        c.url                   # rediss://127.0.0.1:P1,...  (no client certificate needed)
        c.ca_file               # the test CA that signed the servers' certificate
        c.add_user("tenant", "secret", *remote_acl_rules("t1"))   # on every node
        c.cli(port, "--scan")   # redis-cli --tls --cacert ..., as the admin (default user)

Every server is started by this object and stopped by its pid at close
(SIGTERM, then SIGKILL), never by name.  The data lives in a temporary
directory that close() removes.  `redis_server_missing()` says why a test
should skip (None when redis-server and redis-cli are installed);
`redis_tls_missing()` likewise for a TLS cluster (redis-server built
without TLS, no openssl command).  The TLS material (a throwaway CA and a
server certificate for 127.0.0.1/localhost) is made with the openssl
command in the cluster's directory: `make_test_ca()`, `make_server_cert()`.

As a pytest fixture:

    @pytest.fixture(scope="module")
    def cluster():
        reason = redis_server_missing()
        if reason:
            pytest.skip(reason)
        with LocalCluster() as c:
            yield c
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

__all__ = ["LocalCluster", "redis_server_missing", "redis_tls_missing", "free_port_pair",
           "make_test_ca", "make_server_cert"]

SERVER = "redis-server"
CLI = "redis-cli"


def redis_server_missing() -> Optional[str]:
    for prog in (SERVER, CLI):
        if shutil.which(prog) is None:
            return f"{prog} is not installed (apt-get install -y redis-server)"
    return None


def redis_tls_missing() -> Optional[str]:
    """Why a TLS cluster cannot be started here; None if it can."""
    reason = redis_server_missing()
    if reason:
        return reason
    if shutil.which("openssl") is None:
        return "the openssl command is not installed (apt-get install -y openssl)"
    # Built with TLS, redis-server knows tls-port and complains about the
    # missing certificate; built without, the directive itself is unknown.
    try:
        r = subprocess.run([SERVER, "--port", "0", "--tls-port", "1", "--tls-cert-file",
                            "/nonexistent", "--tls-key-file", "/nonexistent",
                            "--tls-auth-clients", "no"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "redis-server --tls-port probe did not finish"
    out = r.stdout + r.stderr
    if "Bad directive" in out or "tls-port" in out and "unknown" in out.lower():
        return "redis-server is built without TLS support"
    return None


def _openssl(*args: str, cwd: str) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {r.stderr.strip()}")


def make_test_ca(directory: str, name: str = "ca") -> tuple[str, str]:
    """A throwaway CA (EC P-256, valid 2 days): (certificate, key) paths in
    directory; the key is 0600."""
    crt, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", crt, "-days", "2",
             "-subj", f"/CN=memosfs test CA {name}", cwd=directory)
    os.chmod(key, 0o600)
    return crt, key


def make_server_cert(directory: str, ca: tuple[str, str], name: str = "server",
                     hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[str, str]:
    """A certificate for hosts signed by ca; (certificate, key) paths, key 0600.
    No extendedKeyUsage: the nodes also present it as clients on the bus."""
    crt, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    csr, ext = os.path.join(directory, f"{name}.csr"), os.path.join(directory, f"{name}.ext")
    san = ",".join(("IP:" if h.replace(".", "").isdigit() or ":" in h else "DNS:") + h
                   for h in hosts)
    with open(ext, "w") as f:
        f.write(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n")
    _openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", csr,
             "-subj", f"/CN={hosts[0]}", cwd=directory)
    os.chmod(key, 0o600)
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", crt, "-days", "2", "-extfile", ext, cwd=directory)
    return crt, key


def _quote(word: str) -> str:
    """A word for redis-cli's stdin (double quotes, backslash escapes)."""
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pair(taken: set[int]) -> int:
    """A port P such that P and its cluster-bus port P+10000 are both free."""
    for _ in range(500):
        p = random.randint(20000, 29999)
        if p in taken or p + 10000 in taken:
            continue
        if _port_free(p) and _port_free(p + 10000):
            return p
    raise RuntimeError("no free loopback port pair found")


class Node:
    def __init__(self, port: int, proc: subprocess.Popen, log: str) -> None:
        self.port = port
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


class LocalCluster:
    """`masters` masters with `replicas` replicas each, on 127.0.0.1.

    tls=True: the nodes listen for TLS only (clients need no certificate;
    the cluster bus and replication use TLS too).  admin_password: the
    default user needs it (requirepass; replicas use it as masterauth);
    `cli()` and `--cluster create` authenticate with it."""

    def __init__(self, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000,
                 maxmemory: str = "512mb", base_dir: Optional[str] = None,
                 start_timeout: float = 30.0, tls: bool = False,
                 admin_password: Optional[str] = None) -> None:
        self.tls = tls
        self.admin_password = admin_password
        self.ca_file: Optional[str] = None
        self._cert: Optional[tuple[str, str]] = None
        self._users: dict[str, tuple[str, ...]] = {}     # re-applied on restart()
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.maxmemory = maxmemory
        self.start_timeout = start_timeout
        self._own_dir = base_dir is None
        self.dir = base_dir or tempfile.mkdtemp(prefix="memosfs-redis-")
        self.nodes: dict[int, Node] = {}
        self.master_ports: list[int] = []
        self.started = False

    # ---- lifecycle ----

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _spawn(self, port: int) -> Node:
        log = os.path.join(self.dir, f"redis-{port}.log")
        if self.tls:
            assert self._cert is not None and self.ca_file is not None
            listen = ["--port", "0", "--tls-port", str(port), "--tls-cluster", "yes",
                      "--tls-replication", "yes", "--tls-cert-file", self._cert[0],
                      "--tls-key-file", self._cert[1], "--tls-ca-cert-file", self.ca_file,
                      "--tls-auth-clients", "optional"]
        else:
            listen = ["--port", str(port)]
        if self.admin_password:
            listen += ["--requirepass", self.admin_password,
                       "--masterauth", self.admin_password]
        args = [SERVER, *listen, "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--cluster-require-full-coverage", "no",
                "--cluster-replica-validity-factor", "0",
                "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
                "--repl-ping-replica-period", "1",
                "--client-output-buffer-limit", "replica 2gb 1gb 60",
                "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru",
                "--logfile", log]
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        node = Node(port, proc, log)
        self.nodes[port] = node
        return node

    def start(self) -> None:
        reason = redis_server_missing()
        if reason:
            raise RuntimeError(reason)
        total = self.masters * (1 + self.replicas)
        taken: set[int] = set()
        try:
            if self.tls:
                tdir = os.path.join(self.dir, "tls")
                os.makedirs(tdir, mode=0o700, exist_ok=True)
                ca = make_test_ca(tdir)
                self.ca_file = ca[0]
                self._cert = make_server_cert(tdir, ca)
            for _ in range(total):
                p = free_port_pair(taken)
                taken |= {p, p + 10000}
                self._spawn(p)
            deadline = time.monotonic() + self.start_timeout
            for port in self.nodes:
                self._wait_ping(port, deadline)
            hosts = [f"127.0.0.1:{p}" for p in self.nodes]
            r = subprocess.run([CLI, *self._cli_conn(), "--cluster", "create", *hosts,
                                "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=max(5.0, deadline - time.monotonic()),
                               env=self._cli_env())
            if r.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{r.stdout}\n{r.stderr}")
            self._wait_ok(deadline)
            self.started = True
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop every server this object started, by pid; remove the data."""
        for node in self.nodes.values():
            if node.proc.poll() is None:
                try:
                    os.kill(node.pid, signal.SIGCONT)      # a paused one cannot exit
                    node.proc.terminate()
                except ProcessLookupError:
                    pass
        for node in self.nodes.values():
            try:
                node.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- helpers ----

    def _cli_conn(self) -> list[str]:
        return ["--tls", "--cacert", self.ca_file] if self.tls and self.ca_file else []

    def _cli_env(self) -> Optional[dict[str, str]]:
        if not self.admin_password:
            return None
        return dict(os.environ, REDISCLI_AUTH=self.admin_password)   # not on a command line

    def cli(self, port: int, *args: str, timeout: float = 5.0, input: Optional[str] = None
            ) -> str:
        """redis-cli on one node as the admin; `input`: commands on stdin
        (keeps secrets off command lines)."""
        r = subprocess.run([CLI, *self._cli_conn(), "-h", "127.0.0.1", "-p", str(port), *args],
                           stdin=subprocess.DEVNULL if input is None else None,
                           input=input, capture_output=True, text=True,
                           timeout=timeout, env=self._cli_env())
        return r.stdout

    def add_user(self, name: str, password: str, *rules: str) -> None:
        """ACL SETUSER name on >password rules... on every live node (ACLs are
        per node in a cluster); restart() applies them again."""
        self._users[name] = (f">{password}", *rules)
        for port, node in self.nodes.items():
            if node.alive():
                self._apply_user(port, name)

    def _apply_user(self, port: int, name: str) -> None:
        words = ["ACL", "SETUSER", name, "reset", "on", *self._users[name]]
        out = self.cli(port, input=" ".join(_quote(w) for w in words) + "\n")
        if out.strip() != "OK":
            raise RuntimeError(f"ACL SETUSER {name} on port {port}: {out.strip()}")

    def scan(self, pattern: str = "*") -> list[str]:
        """Every key matching pattern on the masters (as the admin)."""
        keys: list[str] = []
        for port in self.masters_now():
            keys += [k for k in self.cli(port, "--scan", "--pattern", pattern).splitlines() if k]
        return sorted(keys)

    def _wait_ping(self, port: int, deadline: float) -> None:
        while True:
            node = self.nodes[port]
            if node.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {port} exited: {self._tail(node)}")
            try:
                if self.cli(port, "ping", timeout=2).strip() == "PONG":
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} does not answer")
            time.sleep(0.05)

    def _info(self, port: int, section: str) -> dict[str, str]:
        """`cluster info` (section "cluster") or `info <section>`, parsed."""
        args = ("cluster", "info") if section == "cluster" else ("info", section)
        out = {}
        for line in self.cli(port, *args).splitlines():
            k, _, v = line.strip().partition(":")
            if v:
                out[k] = v
        return out

    def _wait_ok(self, deadline: float) -> None:
        """Until every node says cluster_state:ok with all slots assigned,
        and (with replicas) every replica's link to its master is up."""
        while True:
            ok = True
            for port, node in self.nodes.items():
                if not node.alive():
                    continue
                try:
                    info = self._info(port, "cluster")
                    if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                        ok = False
                        break
                    if self.replicas:
                        repl = self._info(port, "replication")
                        if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                            ok = False
                            break
                except subprocess.TimeoutExpired:
                    ok = False
                    break
            if ok:
                self.master_ports = self.masters_now()
                if len(self.master_ports) == self.masters:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("cluster did not become ok in time")
            time.sleep(0.1)

    def _tail(self, node: Node) -> str:
        try:
            with open(node.log) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def nodes_table(self) -> list[dict]:
        """CLUSTER NODES of a live node, parsed."""
        for port, node in self.nodes.items():
            if not node.alive():
                continue
            try:
                text = self.cli(port, "cluster", "nodes", timeout=2)
            except subprocess.TimeoutExpired:
                continue
            rows = []
            for line in text.splitlines():
                f = line.split()
                if len(f) < 8:
                    continue
                addr = f[1].split("@")[0]
                rows.append({"id": f[0], "port": int(addr.rsplit(":", 1)[1]),
                             "flags": f[2].split(","), "master": f[3],
                             "link": f[7], "slots": f[8:]})
            if rows:
                return rows
        return []

    def masters_now(self) -> list[int]:
        return sorted(r["port"] for r in self.nodes_table()
                      if "master" in r["flags"] and "fail" not in r["flags"] and r["slots"])

    def keyslot(self, key: bytes | str) -> int:
        from redis.crc import key_slot
        return key_slot(key.encode() if isinstance(key, str) else key)

    def master_for(self, key: bytes | str) -> int:
        """The port of the master that serves the key's hash slot now."""
        slot = self.keyslot(key)
        for r in self.nodes_table():
            if "master" not in r["flags"] or "fail" in r["flags"]:
                continue
            for rng in r["slots"]:
                if rng.startswith("["):
                    continue
                lo, _, hi = rng.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return r["port"]
        raise LookupError(f"no master serves slot {slot}")

    @property
    def scheme(self) -> str:
        return "rediss" if self.tls else "redis"

    @property
    def url(self) -> str:
        ports = self.master_ports or sorted(self.nodes)
        return f"{self.scheme}://" + ",".join(f"127.0.0.1:{p}" for p in ports)

    @property
    def all_url(self) -> str:
        return f"{self.scheme}://" + ",".join(f"127.0.0.1:{p}" for p in sorted(self.nodes))

    # ---- faults ----

    def kill(self, port: int, sig: int = signal.SIGKILL) -> None:
        node = self.nodes[port]
        if node.alive():
            os.kill(node.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                node.proc.wait(timeout=10)

    def pause(self, port: int) -> None:
        os.kill(self.nodes[port].pid, signal.SIGSTOP)

    def resume(self, port: int) -> None:
        os.kill(self.nodes[port].pid, signal.SIGCONT)

    def restart(self, port: int, timeout: float = 20.0) -> None:
        """Start a killed node again on its port (it rejoins with its nodes.conf)."""
        node = self.nodes[port]
        if node.alive():
            return
        self._spawn(port)
        self._wait_ping(port, time.monotonic() + timeout)
        for name in self._users:
            self._apply_user(port, name)

    def wait_ok(self, timeout: float = 20.0) -> None:
        self._wait_ok(time.monotonic() + timeout)

    def flushall(self) -> None:
        for port in self.masters_now():
            self.cli(port, "flushall")
