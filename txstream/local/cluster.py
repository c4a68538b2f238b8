"""A real Apache Kafka cluster on this machine, from the broker jars on Maven Central.

Why not a mock: librdkafka's mock cluster and the Kafka lookalikes we tried get read_committed
and transactional offset commits wrong, which is exactly what txstream promises. So development,
tests and benchmarks run Apache Kafka itself, in KRaft mode (combined broker+controller nodes),
on the machine's Java 17. The jars are resolved once with Maven into a per-user cache.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from txstream.errors import BrokerError
from txstream.local import processes
from txstream.local.maven import Artifact, MavenError, resolve
from txstream.local.paths import cache_dir
from txstream.local.tls import TlsMaterial, make_tls_material

# 4.4.0's kafka-tools artifacts are not on Maven Central (checked 2026-11); 4.3.1 is complete.
KAFKA_VERSION = os.environ.get("TXSTREAM_KAFKA_VERSION", "4.3.1")
LOG4J_VERSION = "2.25.4"
SLF4J_VERSION = "2.0.17"


def registry_dir() -> Path:
    """Where `kafka up` records running clusters so `down` and `status` can find them: one per
    cache directory, so a cluster started under another TXSTREAM_CACHE_DIR is not listed here."""
    path = cache_dir() / "clusters"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------------------------------------
# Jars
# ---------------------------------------------------------------------------------------------

def kafka_libs(progress: Callable[[str], None] = lambda _m: None) -> Path:
    """The directory of Kafka's jars, resolved from Maven Central on first use."""
    artifacts = [Artifact("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
                 Artifact("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
                 Artifact("org.slf4j", "slf4j-api", SLF4J_VERSION),
                 Artifact("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION)]
    try:
        return resolve(f"kafka-{KAFKA_VERSION}", artifacts, progress, what=f"Apache Kafka {KAFKA_VERSION}",
                       missing_hint="set TXSTREAM_BOOTSTRAP_SERVERS to use an existing cluster")
    except MavenError as exc:
        raise BrokerError(str(exc)) from exc


# ---------------------------------------------------------------------------------------------
# Cluster
# ---------------------------------------------------------------------------------------------

def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port_block(count: int, blocks: int = 2) -> int:
    """A base port such that base .. base+count-1 and base+100 .. (and base+200 .. with
    blocks=3, for a SASL listener) are all free, outside the kernel's ephemeral range.

    Inside it, a stopped node's port is a free source port for any outgoing connection on the
    machine (clients reconnecting to that very node included), and the node then cannot bind it
    when it restarts."""
    import random

    low, high = _ephemeral_ports()
    span = 100 * (blocks - 1) + count
    ranges = [(r_low, r_high - span) for r_low, r_high in ((10_000, low), (high + 1, 65_000)) if r_high - span > r_low]
    pick = random.Random()
    for _ in range(500):
        r_low, r_high = pick.choice(ranges)
        base = pick.randrange(r_low, r_high)
        if all(port_is_free(base + 100 * b + i) for i in range(count) for b in range(blocks)):
            return base
    raise BrokerError("Could not find free ports for a local Kafka cluster.")


_LOG4J2 = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""

# Every request the broker completes, one line each (its API, client, body and the broker's
# timings: local, remote, queue), after the epoch milliseconds it was logged at. Kafka's own
# request logger at DEBUG: heavy, for studying a run's requests, never a default.
_REQUEST_LOG4J2 = """appender.requests.type = File
appender.requests.name = requests
appender.requests.fileName = {log}
appender.requests.layout.type = PatternLayout
appender.requests.layout.pattern = %d{{UNIX_MILLIS}} %m%n
logger.requests.name = kafka.request.logger
logger.requests.level = DEBUG
logger.requests.additivity = false
logger.requests.appenderRef.requests.ref = requests
"""


@dataclass
class Node:
    node_id: int
    port: int
    controller_port: int
    directory: str
    pid: int | None = None

    @property
    def log_file(self) -> Path:
        return Path(self.directory) / "server.log"


@dataclass
class LocalKafkaCluster:
    """One or more combined broker+controller KRaft nodes on this machine.

    Clients reach them at `listen` (default localhost); `advertise` is the address the brokers
    tell clients to use (default: `listen`, or this machine's name when listening on 0.0.0.0), so
    a broker listening on a network address serves Spark executors on other hosts. The
    controllers always talk over localhost.

    Broker i listens on `port + i`, its controller on `port + 100 + i`. With three nodes the
    internal topics use replication 3 and min ISR 2, as Kafka's transactions system test does.

    A secured listener on `port + 200 + i` (`secured_bootstrap_servers`) when any of these is set:
    `sasl_users` ({user: password}, SASL/PLAIN), `scram_users` (SASL/SCRAM-SHA-512 and -256,
    the users created through Kafka's admin API once the cluster is up), `tls` (TLS with a
    throwaway CA, local/tls.py; client certificates accepted, not required). Its protocol is
    SASL_SSL, SASL_PLAINTEXT or SSL accordingly; `client_properties()` says how to reach it.
    Inter-broker and controller traffic stay PLAINTEXT on localhost. `authorizer` turns on ACLs.
    """

    port: int = 9092
    data_dir: str = ""
    brokers: int = 1
    heap: str = "768m"
    nodes: list[Node] = field(default_factory=list)
    cluster_id: str = ""
    die_with_parent: bool = False  # tests: the JVMs die when the test process dies
    sasl_users: dict[str, str] | None = None
    scram_users: dict[str, str] | None = None
    # SASL/OAUTHBEARER: tokens validated against this JWKS endpoint (Kafka's OIDC validator).
    oauth_jwks_url: str = ""
    tls: bool = False
    # KRaft's StandardAuthorizer, nothing allowed without an ACL; the plaintext listeners'
    # principal (User:ANONYMOUS: brokers, controllers and tests' admin clients) is a super user.
    authorizer: bool = False
    listen: str = "localhost"
    advertise: str = ""
    overrides: dict[str, str] = field(default_factory=dict)   # broker properties, after txstream's
    request_log: bool = False   # each node logs every request it completes (`request_log_file`)

    def __post_init__(self) -> None:
        if not self.data_dir:
            self.data_dir = str(cache_dir() / "data" / f"kafka-{self.port}")
        if not self.nodes:
            self.nodes = [Node(i + 1, self.port + i, self.port + 100 + i,
                               os.path.join(self.data_dir, f"node-{i + 1}")) for i in range(self.brokers)]

    @property
    def advertised_host(self) -> str:
        if self.advertise:
            return self.advertise
        return socket.getfqdn() if self.listen in ("0.0.0.0", "::", "") else self.listen

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.advertised_host}:{n.port}" for n in self.nodes)

    @property
    def secured(self) -> bool:
        return bool(self.sasl_users or self.scram_users or self.oauth_jwks_url or self.tls)

    @property
    def secured_protocol(self) -> str | None:
        if not self.secured:
            return None
        sasl = bool(self.sasl_users or self.scram_users or self.oauth_jwks_url)
        return ("SASL_SSL" if self.tls else "SASL_PLAINTEXT") if sasl else "SSL"

    @property
    def secured_bootstrap_servers(self) -> str | None:
        """The secured listeners, when there are any."""
        if not self.secured:
            return None
        return ",".join(f"{self.advertised_host}:{self._secured_port(n)}" for n in self.nodes)

    @property
    def sasl_bootstrap_servers(self) -> str | None:
        return self.secured_bootstrap_servers

    @property
    def tls_material(self) -> TlsMaterial | None:
        """The CA and keystores of the TLS listener (made at the first start)."""
        if not self.tls:
            return None
        return make_tls_material(Path(self.data_dir) / "tls", [self.advertised_host])

    def client_properties(self, user: str | None = None, client_certificate: bool = False) -> dict[str, str]:
        """What a client sets to use the secured listener as `user` (a SCRAM user before a PLAIN
        one; the first of them without `user`), and with the CA's client certificate."""
        if not self.secured:
            return {}
        props = {"security.protocol": self.secured_protocol}
        users = {**(self.sasl_users or {}), **(self.scram_users or {})}
        if users:
            name = user or next(iter(users))
            props.update({"sasl.mechanism": "SCRAM-SHA-512" if name in (self.scram_users or {}) else "PLAIN",
                          "sasl.username": name, "sasl.password": users[name]})
        if self.tls:
            material = self.tls_material
            props["ssl.ca.location"] = material.ca_pem
            if client_certificate:
                props.update({"ssl.keystore.location": material.client_keystore,
                              "ssl.keystore.password": material.password})
        return props

    def write_client_properties(self, user: str | None = None) -> Path:
        """`client_properties(user)` as a properties file only its owner reads (--command-config)."""
        path = Path(self.data_dir) / "client.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text("".join(f"{k}={v}\n" for k, v in self.client_properties(user).items()))
        return path

    def _bind_host(self) -> str:
        """The address the client listeners bind (for checking a port is free or taken)."""
        if self.listen in ("", "::", "0.0.0.0"):
            return "0.0.0.0"
        return "127.0.0.1" if self.listen == "localhost" else self.listen

    @staticmethod
    def _secured_port(node: Node) -> int:
        return node.port + 200

    def _listeners(self, node: Node) -> list[str]:
        host, public = self.listen, self.advertised_host
        if not self.secured:
            return [f"listeners=PLAINTEXT://{host}:{node.port},CONTROLLER://localhost:{node.controller_port}",
                    f"advertised.listeners=PLAINTEXT://{public}:{node.port}",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"]
        port = self._secured_port(node)
        lines = [f"listeners=PLAINTEXT://{host}:{node.port},CONTROLLER://localhost:{node.controller_port},"
                 f"SECURED://{host}:{port}",
                 f"advertised.listeners=PLAINTEXT://{public}:{node.port},SECURED://{public}:{port}",
                 f"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SECURED:{self.secured_protocol}"]
        mechanisms = [*(["PLAIN"] if self.sasl_users else []),
                      *(["SCRAM-SHA-512", "SCRAM-SHA-256"] if self.scram_users else []),
                      *(["OAUTHBEARER"] if self.oauth_jwks_url else [])]
        if mechanisms:
            lines.append(f"listener.name.secured.sasl.enabled.mechanisms={','.join(mechanisms)}")
        if self.sasl_users:
            users = " ".join(f'user_{u}="{pw}"' for u, pw in self.sasl_users.items())
            lines.append("listener.name.secured.plain.sasl.jaas.config="
                         f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};")
        for mechanism in (m for m in mechanisms if m.startswith("SCRAM")):
            lines.append(f"listener.name.secured.{mechanism.lower()}.sasl.jaas.config="
                         "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        if self.oauth_jwks_url:
            lines += ["listener.name.secured.oauthbearer.sasl.jaas.config="
                      "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
                      "listener.name.secured.oauthbearer.sasl.server.callback.handler.class="
                      "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
                      f"listener.name.secured.oauthbearer.sasl.oauthbearer.jwks.endpoint.url={self.oauth_jwks_url}",
                      f"sasl.oauthbearer.jwks.endpoint.url={self.oauth_jwks_url}"]
        if self.tls:
            material = self.tls_material
            lines += [f"listener.name.secured.ssl.keystore.location={material.broker_keystore}",
                      f"listener.name.secured.ssl.keystore.password={material.password}",
                      "listener.name.secured.ssl.keystore.type=PKCS12",
                      f"listener.name.secured.ssl.truststore.location={material.truststore}",
                      f"listener.name.secured.ssl.truststore.password={material.password}",
                      "listener.name.secured.ssl.truststore.type=PKCS12",
                      "listener.name.secured.ssl.client.auth=requested"]
        return lines

    @property
    def state_file(self) -> Path:
        return registry_dir() / f"{self.port}.json"

    # -- configuration ------------------------------------------------------------------------

    def _properties(self, node: Node) -> str:
        replication = min(3, len(self.nodes))
        min_isr = 2 if replication >= 3 else 1
        voters = ",".join(f"{n.node_id}@localhost:{n.controller_port}" for n in self.nodes)
        return "\n".join([
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            *self._listeners(node),
            *(["authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
               "allow.everyone.if.no.acl.found=false", "super.users=User:ANONYMOUS"] if self.authorizer else []),
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={os.path.join(node.directory, 'data')}",
            # Transactions on a small cluster: the internal topics must fit the node count.
            f"offsets.topic.replication.factor={replication}",
            "offsets.topic.num.partitions=10",
            f"transaction.state.log.replication.factor={replication}",
            f"transaction.state.log.min.isr={min_isr}",
            "transaction.state.log.num.partitions=10",
            f"default.replication.factor={replication}",
            f"min.insync.replicas={min_isr}",
            "num.partitions=1",
            # Quick tests: no 3 s wait before the first rebalance, quick abort of stale txns.
            "group.initial.rebalance.delay.ms=0",
            "group.consumer.heartbeat.interval.ms=1000",
            "group.consumer.min.heartbeat.interval.ms=1000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms=5000",
            "transaction.remove.expired.transaction.cleanup.interval.ms=60000",
            "auto.create.topics.enable=false",
            "log.segment.bytes=67108864",
            "num.network.threads=2",
            "num.io.threads=4",
            *(f"{key}={value}" for key, value in self.overrides.items()),   # a later line wins
            "",
        ])

    def _log4j2(self, node: Node) -> str:
        text = _LOG4J2.format(log=node.log_file)
        return text + _REQUEST_LOG4J2.format(log=self.request_log_file(node)) if self.request_log else text

    @staticmethod
    def request_log_file(node: Node) -> str:
        """Where a node started with `request_log` writes its requests."""
        return os.path.join(node.directory, "requests.log")

    def _java_command(self, libs: Path, node: Node, main: str, *args: str) -> list[str]:
        java = processes.require_java()
        return [java, f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true",
                # Kafka 4 fetches only the OAuth URLs it is told it may (the JWKS endpoint).
                *([f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.oauth_jwks_url}"]
                  if self.oauth_jwks_url else []),
                f"-Dlog4j2.configurationFile={os.path.join(node.directory, 'log4j2.properties')}",
                "-cp", str(libs / "*"), main, *args]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, progress: Callable[[str], None] = lambda _m: None, timeout: float = 120.0) -> str:
        """Format (first time), start every node, wait until the cluster serves transactions."""
        existing = read_registered(self.port)
        if existing and existing.alive_pids():
            raise BrokerError(f"A local Kafka cluster already runs at {existing.bootstrap_servers} "
                              f"(pids {', '.join(map(str, existing.alive_pids()))}); "
                              "`txstream kafka down` stops it.")
        for node in self.nodes:
            client_host = self._bind_host()
            for port, host in ((node.port, client_host), (node.controller_port, "127.0.0.1"),
                               *([(self._secured_port(node), client_host)] if self.secured else [])):
                if not port_is_free(port, host):
                    raise BrokerError(f"Port {port} is already in use; pick another with --port "
                                      "(or stop what listens there).")
        libs = kafka_libs(progress)
        if not self.cluster_id:
            # Kafka's storage tool reads an id starting with '-' as an option (1 in 64 ids): avoid it.
            while not self.cluster_id or self.cluster_id.startswith("-"):
                self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        for node in self.nodes:
            os.makedirs(node.directory, exist_ok=True)
            Path(node.directory, "server.properties").write_text(self._properties(node))
            Path(node.directory, "log4j2.properties").write_text(self._log4j2(node))
            if not Path(node.directory, "data", "meta.properties").exists():
                progress(f"Formatting storage of node {node.node_id} in {node.directory}")
                fmt = subprocess.run(
                    self._java_command(libs, node, "kafka.tools.StorageTool", "format", "-t",
                                       self.cluster_id, "-c", os.path.join(node.directory, "server.properties"),
                                       "--ignore-formatted"),
                    capture_output=True, text=True)
                if fmt.returncode != 0:
                    raise BrokerError(f"Formatting Kafka storage failed:\n{fmt.stdout}\n{fmt.stderr}")
        for node in self.nodes:
            self.start_node(node.node_id, wait=False)
        progress(f"Starting Apache Kafka {KAFKA_VERSION} ({len(self.nodes)} node(s)) ...")
        self.save()
        self.wait_ready(timeout)
        return self.bootstrap_servers

    def start_node(self, node_id: int, wait: bool = True, timeout: float = 90.0) -> None:
        node = self.node(node_id)
        libs = kafka_libs()
        preexec = processes.die_with_parent if self.die_with_parent else None
        self._log_offsets[node_id] = node.log_file.stat().st_size if node.log_file.exists() else 0
        with open(Path(node.directory) / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                self._java_command(libs, node, "kafka.Kafka", os.path.join(node.directory, "server.properties")),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=preexec, cwd=node.directory)
        node.pid = proc.pid
        self._procs[node_id] = proc
        self.save()
        if wait:
            self._wait_node(node, timeout)

    def stop_node(self, node_id: int, hard: bool = False, timeout: float = 60.0) -> None:
        """Stop one node: SIGKILL when hard, else SIGTERM and wait for a clean shutdown."""
        node = self.node(node_id)
        if node.pid is None:
            return
        processes.signal_and_wait(node.pid, signal.SIGKILL if hard else signal.SIGTERM, timeout, self._procs.get(node_id))
        node.pid = None
        self._procs.pop(node_id, None)
        self.save()

    def stop(self, timeout: float = 60.0) -> None:
        for node in self.nodes:
            self.stop_node(node.node_id, timeout=timeout)
        self.state_file.unlink(missing_ok=True)

    def destroy(self) -> None:
        """Stop and delete all data (tests)."""
        try:
            self.stop(timeout=30)
        finally:
            for node in self.nodes:
                if node.pid:
                    processes.signal_and_wait(node.pid, signal.SIGKILL, 10, self._procs.get(node.node_id))
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- readiness ----------------------------------------------------------------------------

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def _wait_node(self, node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.pid is None or not processes.alive(node.pid, self._procs.get(node.node_id)):
                raise BrokerError(f"Kafka node {node.node_id} exited during start-up. "
                                  f"{self.log_errors(node)}Last lines of {node.log_file}:\n{self.log_tail(node)}")
            fresh_log = _read(node.log_file)[self._log_offsets.get(node.node_id, 0):]
            if not port_is_free(node.port, self._bind_host()) and "Kafka Server started" in fresh_log:
                return
            time.sleep(0.2)
        raise BrokerError(f"Kafka node {node.node_id} did not come up within {timeout:.0f}s. "
                          f"Last lines of {node.log_file}:\n{self.log_tail(node)}")

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Every node started, and the cluster answers a metadata request with all brokers."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                self._wait_node(node, max(1.0, deadline - time.monotonic()))
            admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
            while True:
                try:
                    meta = admin.list_topics(timeout=5)
                    if len(meta.brokers) == len(self.nodes):
                        break
                except Exception:  # still starting; retried until the deadline
                    pass
                if time.monotonic() > deadline:
                    raise BrokerError(f"Kafka at {self.bootstrap_servers} did not answer within "
                                      f"{timeout:.0f}s. Last lines of its log:\n{self.log_tail(self.nodes[0])}")
                time.sleep(0.3)
            self._create_scram_users(admin, max(5.0, deadline - time.monotonic()))
        except BrokerError:
            for node in self.nodes:
                if node.pid:
                    processes.signal_and_wait(node.pid, signal.SIGKILL, 10, self._procs.get(node.node_id))
                    node.pid = None
            self.state_file.unlink(missing_ok=True)
            raise

    def _create_scram_users(self, admin, timeout: float) -> None:
        """The SCRAM users, through Kafka's admin API (KRaft keeps their credentials in its metadata)."""
        if not self.scram_users:
            return
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        # One alteration per user per request: a request per mechanism.
        for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256):
            upserts = [UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), password.encode())
                       for user, password in self.scram_users.items()]
            try:
                for future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).values():
                    future.result()
            except Exception as exc:   # KafkaException: the cluster is unusable as asked
                raise BrokerError(f"Creating the SCRAM users failed: {exc}") from None

    def log_tail(self, node: Node, lines: int = 25) -> str:
        text = _read(node.log_file) or _read(Path(node.directory) / "stdout.log")
        return "\n".join(text.splitlines()[-lines:]) or "(the log is empty)"

    def log_errors(self, node: Node, lines: int = 5) -> str:
        """The first ERROR/FATAL lines this start of the node logged (the cause, which the
        shutdown lines at the log's end hide), or nothing."""
        fresh = _read(node.log_file)[self._log_offsets.get(node.node_id, 0):]
        errors = [line for line in fresh.splitlines() if "] ERROR " in line or "] FATAL " in line][:lines]
        return ("Errors it logged:\n" + "\n".join(errors) + "\n") if errors else ""

    def alive_pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.pid and processes.alive(n.pid, self._procs.get(n.node_id))]

    # -- registry -----------------------------------------------------------------------------

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items()}
        data["kafka_version"] = KAFKA_VERSION
        self.state_file.write_text(json.dumps(data, indent=2))

    @property
    def _procs(self) -> dict[int, subprocess.Popen]:
        # Popen objects let us reap our own children; not part of the saved state.
        return self.__dict__.setdefault("_procs_store", {})

    @property
    def _log_offsets(self) -> dict[int, int]:
        # Where each node's log stood when it was (re)started: readiness is read after it.
        return self.__dict__.setdefault("_log_offsets_store", {})


def read_registered(port: int) -> LocalKafkaCluster | None:
    path = registry_dir() / f"{port}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    data.pop("kafka_version", None)
    data["nodes"] = [Node(**n) for n in data["nodes"]]
    return LocalKafkaCluster(**data)


def listener_on(port: int, host: str = "127.0.0.1") -> str | None:
    """What listens on `port` at `host`, as `pid N (command)` when this user may see it, else
    `something`; None when nothing does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        if sock.connect_ex((host, port)) != 0:
            return None
    return _listening_process(port) or "something"


def _listening_process(port: int) -> str | None:
    """`pid N (main class or script)` of the process listening on TCP `port`, from /proc (Linux):
    the socket's inode in /proc/net/tcp*, then the process holding it. None elsewhere, or when the
    process is another user's. Read by hand because psutil is not a runtime dependency."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address HEX_IP:HEX_PORT, state 0A is LISTEN
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                main = next((w for w in command.split() if w.startswith("kafka.") or w.endswith(".py")), "")
                return f"pid {proc.name} ({main or command[:80]})"
        except OSError:
            continue
    return None


def registered_clusters() -> list[LocalKafkaCluster]:
    clusters = []
    for path in sorted(registry_dir().glob("*.json")):
        try:
            cluster = read_registered(int(path.stem))
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            path.unlink(missing_ok=True)
            continue
        if cluster is not None:
            clusters.append(cluster)
    return clusters


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
