"""A local schema registry (`txstream registry up|down|status`): Apicurio Registry from Maven Central.

Apicurio speaks Confluent's schema registry API under `/apis/ccompat/v7`, which confluent-kafka's
`SchemaRegistryClient` (and so txstream) uses. Its `all` distribution (a Quarkus app, one tar.gz)
is resolved once into the cache, as the Kafka jars are; 3.0.9 is the newest that runs on Java 17
(3.3 needs 21). In-memory storage: a registry for tests and trying things out, whose schemas go
when it stops. Registered per cache directory like the local clusters (local/cluster.py), so that
`down` stops only what it should.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import signal
import ssl
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from txstream.errors import UserError
from txstream.local.cluster import port_is_free
from txstream.local.paths import cache_dir
from txstream.local.processes import alive, die_with_parent, require_java, signal_and_wait
from txstream.local.tls import TlsMaterial, make_tls_material

APICURIO_VERSION = "3.0.9"
DEFAULT_PORT = 8081
API = "/apis/ccompat/v7"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"


class RegistryError(UserError):
    """A problem starting, finding or stopping the local schema registry."""


def registries_dir() -> Path:
    path = cache_dir() / "registries"
    path.mkdir(parents=True, exist_ok=True)
    return path


def apicurio_app(progress: Callable[[str], None] = lambda _m: None) -> Path:
    """The unpacked Apicurio Registry app (its runner jar and lib/), downloaded on first use.

    Straight from Maven Central, its SHA-1 checked: `mvn` cannot resolve this artifact (its parent
    POM is not published for 3.0.9), and it has no dependencies to resolve."""
    home = cache_dir() / f"apicurio-registry-{APICURIO_VERSION}"
    runner = home / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
    if runner.exists():
        return runner
    name = f"apicurio-registry-app-{APICURIO_VERSION}-all.tar.gz"
    url = f"{MAVEN_CENTRAL}/io/apicurio/apicurio-registry-app/{APICURIO_VERSION}/{name}"
    partial = home.with_name(home.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    progress(f"Downloading Apicurio Registry {APICURIO_VERSION} from Maven Central into {home} (first use only) ...")
    try:
        archive = partial / name
        with urllib.request.urlopen(url, timeout=60) as reply, open(archive, "wb") as out:
            shutil.copyfileobj(reply, out)
        with urllib.request.urlopen(url + ".sha1", timeout=60) as reply:
            expected = reply.read().decode().split()[0]
    except OSError as exc:
        raise RegistryError(f"Could not download {url}: {exc}. Set TXSTREAM_SCHEMA_REGISTRY_URL to use an existing "
                            "registry.") from None
    if hashlib.sha1(archive.read_bytes()).hexdigest() != expected:
        raise RegistryError(f"{url} does not match its published SHA-1: not used.")
    with tarfile.open(archive) as tar:
        tar.extractall(partial / "app", filter="data")
    next((partial / "app").rglob(runner.name)).parent.rename(home)
    shutil.rmtree(partial, ignore_errors=True)
    return runner


@dataclass
class LocalRegistry:
    """One Apicurio Registry on 127.0.0.1:`port` (its management port: `port + 1`)."""

    port: int = DEFAULT_PORT
    pid: int | None = None
    log: str = ""
    die_with_parent: bool = False
    # HTTPS only, its certificate signed by the CA local/tls.py makes in this directory. (Apicurio's
    # build fixes client authentication off: no mutual TLS.)
    tls_dir: str = ""

    @property
    def url(self) -> str:
        """The base URL of the Confluent-compatible API (what `--schema-registry` takes)."""
        return f"{'https' if self.tls_dir else 'http'}://{'localhost' if self.tls_dir else '127.0.0.1'}:{self.port}{API}"

    @property
    def tls(self) -> TlsMaterial | None:
        return make_tls_material(self.tls_dir, ["localhost"]) if self.tls_dir else None

    def client_properties(self) -> dict[str, str]:
        """SchemaRegistryClient's settings to reach it (with TLS: the CA)."""
        return {"ssl.ca.location": self.tls.ca_pem} if self.tls_dir else {}

    @property
    def state_file(self) -> Path:
        return registries_dir() / f"{self.port}.json"

    def start(self, progress: Callable[[str], None] = lambda _m: None, timeout: float = 120.0) -> str:
        existing = read_registered(self.port)
        if existing is not None and existing.alive():
            raise RegistryError(f"A local schema registry already runs at {existing.url} (pid {existing.pid}); "
                                "`txstream registry down` stops it.")
        for port in (self.port, self.port + 1, *((self.port + 2,) if self.tls_dir else ())):
            if not port_is_free(port, "127.0.0.1"):
                raise RegistryError(f"Port {port} is already in use; pick another with --port.")
        runner = apicurio_app(progress)
        java = require_java()
        log_path = registries_dir() / f"{self.port}.log"
        self.log = str(log_path)
        command = [java, "-Xmx512m", "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
                   "-Dquarkus.management.host=127.0.0.1", f"-Dquarkus.management.port={self.port + 1}",
                   "-Dapicurio.rest.deletion.artifact.enabled=true",
                   "-Dapicurio.rest.deletion.artifact-version.enabled=true",
                   "-Dquarkus.log.level=WARN", *self._tls_options(), "-jar", str(runner)]
        progress(f"Starting Apicurio Registry {APICURIO_VERSION} on 127.0.0.1:{self.port} ...")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(command, cwd=str(runner.parent), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=die_with_parent if self.die_with_parent else None)
        self.pid = proc.pid
        self.__dict__["_proc"] = proc
        self.save()
        deadline = time.monotonic() + timeout
        while not self.answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = _tail(log_path)
                self.stop()
                raise RegistryError(f"The schema registry did not start within {timeout:.0f}s "
                                    f"(exit {proc.poll()}). Last lines of its log:\n{tail}")
            time.sleep(0.3)
        # Confluent's default rule, set through Confluent's own API (what its clients read back).
        request = urllib.request.Request(f"{self.url}/config", b'{"compatibility": "BACKWARD"}', method="PUT",
                                         headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(request, timeout=10, context=self._context()):
            pass
        return self.url

    def _tls_options(self) -> list[str]:
        if not self.tls_dir:
            return []
        tls = self.tls
        return [f"-Dquarkus.http.ssl-port={self.port}", f"-Dquarkus.http.port={self.port + 2}",
                "-Dquarkus.http.insecure-requests=disabled",
                f"-Dquarkus.http.ssl.certificate.key-store-file={tls.broker_keystore}",
                f"-Dquarkus.http.ssl.certificate.key-store-password={tls.password}",
                "-Dquarkus.http.ssl.certificate.key-store-file-type=PKCS12"]

    def _context(self) -> ssl.SSLContext | None:
        if not self.tls_dir:
            return None
        return ssl.create_default_context(cafile=self.tls.ca_pem)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2, context=self._context()) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def alive(self) -> bool:
        return self.pid is not None and alive(self.pid, self.__dict__.get("_proc"))

    def stop(self, timeout: float = 30.0) -> None:
        if self.pid is not None and self.alive():
            signal_and_wait(self.pid, signal.SIGTERM, timeout, self.__dict__.get("_proc"))
            if self.alive():
                signal_and_wait(self.pid, signal.SIGKILL, 10, self.__dict__.get("_proc"))
        self.state_file.unlink(missing_ok=True)
        if self.log:
            Path(self.log).unlink(missing_ok=True)   # its schemas are gone with it: nothing to look back at

    def save(self) -> None:
        self.state_file.write_text(json.dumps(asdict(self), indent=2))


def read_registered(port: int) -> LocalRegistry | None:
    path = registries_dir() / f"{port}.json"
    if not path.exists():
        return None
    return LocalRegistry(**json.loads(path.read_text()))


def registered_registries() -> list[LocalRegistry]:
    """Every registry registered in this cache directory (stale entries dropped)."""
    found = []
    for path in sorted(registries_dir().glob("*.json")):
        registry = read_registered(int(path.stem))
        if registry is not None and registry.alive():
            found.append(registry)
        else:
            path.unlink(missing_ok=True)
    return found


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(the log is empty)"
    except OSError:
        return "(no log)"

