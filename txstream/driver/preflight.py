"""The executor preflight: before a cluster run reads anything, every executor core proves it can
run the run's tasks.

A missing library on one host would otherwise surface batch after batch as task failures of the
machinery (retried, never dead-lettered: docs/architecture.md §5), and a wrong Kafka address
(`localhost:9092` reaches each executor's own loopback) would read another cluster. One task per
executor core (task/probe.py, shipped by value) reports its host, its interpreter and library
versions, whether the processor's module imports, the id of the Kafka cluster it reaches and
whether its local directory is writable; this module compares each answer with the driver's.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from txstream.classify import one_line
from txstream.errors import ExecutorEnvironmentError
from txstream.spark.remote_errors import from_spark
from txstream.task import probe as probe_module

PROBE_HOLD_S = 0.5
# Spark's words for a failed task: "Lost task 1.3 in stage 0.0 (TID 7) (10.0.0.6 executor 2): <why>"
# (read for the message only; what the failure is was decided by its type above).
_SPARK_TASK_FAILURE = re.compile(r"Lost task [\d.]+ in stage [\d.]+ \(TID \d+\) \(([^)]*)\): ([^\n]*)")


def loopback_hosts(bootstrap: str) -> list[str]:
    """The bootstrap addresses that name this host's loopback (localhost, 127.x, ::1)."""
    hosts = []
    for server in bootstrap.split(","):
        host = server.strip().rpartition(":")[0].strip("[]")
        if host in ("localhost", "::1") or host.startswith("127."):
            hosts.append(server.strip())
    return hosts


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    """Kafka client settings an executor can be sent (no logger objects or callbacks)."""
    return {k: v for k, v in config.items() if isinstance(v, (str, int, float, bool))}


def differences(driver: dict[str, Any], executor: dict[str, Any]) -> list[str]:
    """What this executor lacks or has differently from the driver, in words."""
    problems = []
    if executor["python"].split(".")[:2] != driver["python"].split(".")[:2]:
        problems.append(f"Python {executor['python']} ({executor['executable']}), the driver has {driver['python']}")
    for name, version in executor["versions"].items():
        expected = driver["versions"].get(name)
        if version != expected:
            problems.append(f"{name} {version}, the driver has {expected}" if not str(version).startswith("not ")
                            else f"{name} is {version}; the driver has {expected}")
    if executor["processor"]:
        problems.append(executor["processor"])
    if executor["kafka_error"]:
        problems.append(f"cannot reach Kafka at {executor['bootstrap']}: {executor['kafka_error']}")
    elif executor["cluster_id"] != driver["cluster_id"]:
        problems.append(f"reaches Kafka cluster {executor['cluster_id']} at {executor['bootstrap']}, the driver "
                        f"planned against cluster {driver['cluster_id']} (a loopback address such as "
                        "localhost means each host's own)")
    if executor["local_dir"]:
        problems.append(executor["local_dir"])
    return problems


def check_executors(spark, admin_config: dict[str, Any], processor_module: str | None,
                    timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """Probe every executor core; raise ExecutorEnvironmentError naming each host that differs.
    Returns the executors' answers (one per core)."""
    from pyspark import cloudpickle

    config = _plain(admin_config)
    driver = probe_module.probe(None, config, timeout_s)
    if driver["kafka_error"]:
        raise ExecutorEnvironmentError(f"the driver cannot reach Kafka for the preflight: {driver['kafka_error']}")
    context = spark.sparkContext
    slots = max(1, context.defaultParallelism)
    cloudpickle.register_pickle_by_value(probe_module)
    try:
        body = probe_module.probe_partition(processor_module, config, timeout_s, PROBE_HOLD_S)
        answers = context.parallelize(range(slots), slots).mapPartitions(body).collect()
    except Exception as exc:
        cause = from_spark(exc)
        where = _SPARK_TASK_FAILURE.search(str(exc))
        detail = f"{where.group(1)}: {where.group(2).strip()[:300]}" if where else one_line(cause)
        raise ExecutorEnvironmentError(
            f"the executor preflight could not run its probe on the executors ({detail}); "
            "their Python environment cannot start Spark's Python workers (is pyspark installed there, at the "
            "driver's Python version? docs/cluster.md)") from exc
    finally:
        cloudpickle.unregister_pickle_by_value(probe_module)
    by_host: dict[tuple[str, str], set[str]] = defaultdict(set)
    for answer in answers:
        answer["bootstrap"] = config.get("bootstrap.servers")
        for problem in differences(driver, answer):
            by_host[(answer["host"], answer["address"], answer["executable"])].add(problem)
    if by_host:
        lines = [f"  host {host} ({address}, Python {executable}): " + "; ".join(sorted(problems))
                 for (host, address, executable), problems in sorted(by_host.items())]
        raise ExecutorEnvironmentError(
            f"the executor preflight found {len(by_host)} host(s) that cannot run this processor; nothing was "
            "read or published:\n" + "\n".join(lines))
    return answers


def describe(answers: list[dict[str, Any]]) -> str:
    """One line: the executors the preflight saw."""
    hosts: dict[str, int] = defaultdict(int)
    for answer in answers:
        hosts[f"{answer['host']} ({answer['address']})"] += 1
    return "executor preflight passed: " + ", ".join(f"{h} x{n}" for h, n in sorted(hosts.items()))


def check_registry(s: Any, echo: Any) -> None:
    """With a schema registry, decide the run's schemas before anything is read (RunSettings `s`
    is completed in place): the input's reader schemas (the processor's, else the subjects'
    latest), and the output's id — registered (or looked up, or the latest) under the output
    subject. An output schema the subject's compatibility rule refuses stops the run here with
    the registry's answer, so nothing is ever published with it; an unreachable registry stops
    it naming the registry."""
    from txstream.errors import SchemaError
    from txstream.serde.registry import latest_schema, register_output, subject_name

    config = s.schema_registry
    if config is None:
        return
    first = s.input_topics[0]
    if s.value_schema is None:
        subject = subject_name(config, first, False, None)
        found = latest_schema(config, subject)
        if found is None:
            raise SchemaError(f"input subject {subject} has no version in the schema registry at {config.url}: "
                              "register the input's schema, or give value_schema")
        s.value_schema = found[1]
        echo(f"schema registry {config.url}: input values read as {subject}'s latest version (id {found[0]})")
    if s.key_schema is None and config.strategy == "topic":
        found = latest_schema(config, subject_name(config, first, True, None))
        if found is not None:
            s.key_schema = found[1]
    s.registry_keys = s.key_schema is not None
    for side, is_key in (("value", False), ("key", True)):
        schema = getattr(s, f"output_{side}_schema")
        if schema is None and not (config.use_latest_version and not is_key):
            continue
        if not s.output_topic:
            raise SchemaError(f"the output {side}s' subject is named after output_topic, which is not set")
        subject = subject_name(config, s.output_topic, is_key, schema.get("name") if schema else None)
        schema_id, schema = register_output(config, subject, schema)
        setattr(s, f"output_{side}_schema", schema)
        setattr(s, f"output_{side}_schema_id", schema_id)
        echo(f"schema registry {config.url}: output {side}s framed with id {schema_id} ({subject})")
