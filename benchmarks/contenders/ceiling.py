"""Contender 7, the ceiling: Kafka's own perf tools move the same number of records, same size.

`ConsumerPerformance` reads the N seeded input records (read_committed, fresh group), then
`ProducerPerformance` writes N records of the input's average value size to the contender's
output topic (acks=all, idempotent, not transactional), one after the other in one process
tree. No decoding, no transform, no encoding: what the broker and the Java clients do alone on
this machine. Its output is checked by count only (the payload is the tool's filler bytes).
"""
from __future__ import annotations

import shlex
import shutil

from benchmarks.contenders import Contender, Job, Unavailable, jvm_collector


class KafkaCeiling(Contender):
    name = "ceiling"
    label = "ceiling: Kafka perf tools (no transform)"
    long_running = False
    verify_values = False
    output_kind = "count"

    def __init__(self) -> None:
        self.libs = None

    def settings(self) -> dict:
        return {"jvm": f"-Xmx512m {jvm_collector()}"}

    def prepare(self, progress) -> None:
        from txstream.local.cluster import KAFKA_VERSION, kafka_libs

        if not shutil.which("java"):
            raise Unavailable("java is not on PATH")
        self.libs = kafka_libs(progress)
        self.kafka_version = KAFKA_VERSION

    def expected_output(self, job: Job) -> int:
        return job.records

    def command(self, job: Job) -> tuple[list[str], dict]:
        java = ["java", "-Xmx512m", jvm_collector(), "-cp", f"{self.libs}/*"]
        consume = java + ["org.apache.kafka.tools.ConsumerPerformance",
                          "--bootstrap-server", job.bootstrap, "--topic", job.input_topic,
                          "--num-records", str(job.records), "--group", job.group,
                          "--timeout", "120000",
                          "--command-property", "isolation.level=read_committed",
                          "--command-property", "auto.offset.reset=earliest"]
        produce = java + ["org.apache.kafka.tools.ProducerPerformance",
                          "--bootstrap-server", job.bootstrap, "--topic", job.output_topic,
                          "--num-records", str(job.records), "--record-size", str(job.avg_value_size),
                          "--throughput", "-1",
                          "--command-property", "acks=all", "enable.idempotence=true", "linger.ms=5",
                          "batch.size=262144"]
        script = f"set -e; {shlex.join(consume)}; {shlex.join(produce)}"
        return ["bash", "-c", script], self.base_env()

    def versions(self) -> dict:
        return {"kafka_tools": getattr(self, "kafka_version", "")}
