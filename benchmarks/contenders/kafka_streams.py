"""Contender: Kafka Streams with processing.guarantee=exactly_once_v2.

A small Java application, benchmarks/contenders/kstreams/ (pom.xml and
src/main/java/txstream/bench/kstreams/EnrichOrders.java): byte[] serdes, Avro's
GenericDatumReader/GenericDatumWriter with the schemas read from the files given on its command
line, decode -> keep amount > 0 -> amount_cents = (long) (amount * 100), is_large = amount > 100
-> encode -> `to(output)` with the same key. One instance, `num.stream.threads=2`,
`application.id` = the run's group, `commit.interval.ms` at Kafka Streams' exactly-once default
(100 ms), `auto.offset.reset=earliest`; Kafka Streams' defaults otherwise.

It runs until stopped, like the hand-written loop: the harness counts the output
(read_committed) and sends SIGTERM once every expected record is there; the application's
shutdown hook then calls `KafkaStreams.close()`.

The same jar holds the wide benchmark's Kafka Streams contender, CustomerTotals.java (started by
benchmarks/wide.py with this module's `build()`, JAR and LIB); StreamsApp.java is what the two share
(command line, settings, running until SIGTERM).

Built with the machine's Maven (`mvn -B -q package`, kafka-streams at the version of the broker
txstream runs, `txstream.local.cluster.KAFKA_VERSION`) into benchmarks/contenders/kstreams/target
on first use, and again only when pom.xml, src/ or the Kafka version change (a digest of them is
kept in target/.build-digest).
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess

from benchmarks.common import BENCH_DIR
from benchmarks.contenders import Contender, Job, Unavailable, jvm_collector

PROJECT = BENCH_DIR / "contenders" / "kstreams"
TARGET = PROJECT / "target"
JAR = TARGET / "kstreams-enrich-orders.jar"
LIB = TARGET / "lib"
DIGEST = TARGET / ".build-digest"
MAIN_CLASS = "txstream.bench.kstreams.EnrichOrders"
THREADS = 2


def _sources_digest(kafka_version: str) -> str:
    h = hashlib.sha256(f"kafka {kafka_version}\n".encode())
    files = [PROJECT / "pom.xml"] + sorted(p for p in (PROJECT / "src").rglob("*") if p.is_file())
    for path in files:
        h.update(str(path.relative_to(PROJECT)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def build(kafka_version: str, progress=lambda _m: None) -> None:
    """`mvn package` the application unless target/ already holds a build of these sources."""
    digest = _sources_digest(kafka_version)
    if JAR.exists() and LIB.is_dir() and DIGEST.exists() and DIGEST.read_text().strip() == digest:
        return
    mvn = shutil.which("mvn")
    if not mvn:
        raise Unavailable("Maven (`mvn`) is needed to build the Kafka Streams application")
    if not shutil.which("javac"):
        raise Unavailable("javac (a JDK, 17 or later) is needed to build the Kafka Streams application")
    progress(f"  building {PROJECT.relative_to(BENCH_DIR.parent)} with Maven (kafka-streams {kafka_version}; "
             "first use or changed sources) ...")
    DIGEST.unlink(missing_ok=True)
    shutil.rmtree(LIB, ignore_errors=True)  # a stale jar of another version must not stay on the class path
    res = subprocess.run([mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(PROJECT / "pom.xml"), "package",
                          f"-Dkafka.version={kafka_version}"],
                         capture_output=True, text=True, timeout=1800)
    if res.returncode != 0 or not JAR.exists():
        tail = " | ".join(line.strip() for line in (res.stdout + res.stderr).strip().splitlines()[-6:])
        raise Unavailable(f"Maven could not build the Kafka Streams application: {tail[-400:]}")
    DIGEST.write_text(digest + "\n")
    progress(f"  built {JAR.relative_to(BENCH_DIR.parent)} ({len(list(LIB.glob('*.jar')))} dependency jars)")


def java_version() -> str:
    """`java -version`'s version string, e.g. '17.0.15'."""
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r'version "([^"]+)"', out)
    return m.group(1) if m else (out.splitlines()[0] if out else "unknown")


class KafkaStreams(Contender):
    name = "kafka-streams"
    label = "Kafka Streams exactly_once_v2"

    def __init__(self) -> None:
        self.kafka_version = ""
        self.java = ""

    def settings(self) -> dict:
        return {"processing.guarantee": "exactly_once_v2", "num.stream.threads": THREADS,
                "commit.interval.ms": "default (100 with exactly-once)", "instances": 1,
                "jvm": f"-Xmx512m {jvm_collector()}"}

    def prepare(self, progress) -> None:
        from txstream.local.cluster import KAFKA_VERSION

        if not shutil.which("java"):
            raise Unavailable("java is not on PATH")
        self.kafka_version = KAFKA_VERSION
        build(KAFKA_VERSION, progress)
        self.java = java_version()

    def command(self, job: Job) -> tuple[list[str], dict]:
        from benchmarks.common import ENRICHED_SCHEMA_PATH, ORDER_SCHEMA_PATH

        return (["java", "-Xmx512m", jvm_collector(),
                 "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                 "-cp", f"{JAR}:{LIB}/*", MAIN_CLASS,
                 "--bootstrap-servers", job.bootstrap, "--input", job.input_topic,
                 "--output", job.output_topic, "--application-id", job.group,
                 "--state-dir", job.workdir, "--threads", str(THREADS),
                 "--input-schema", str(ORDER_SCHEMA_PATH), "--output-schema", str(ENRICHED_SCHEMA_PATH)],
                self.base_env())

    def versions(self) -> dict:
        return {"kafka_streams": self.kafka_version, "kafka_streams_java": self.java}
