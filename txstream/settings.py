"""Run settings: what a processor declares, overridden by the command line, validated once."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txstream.constants import EXACTLY_ONCE, GUARANTEES, WIDE_MODES
from txstream.errors import SettingsError, TransformError
from txstream.kafka.config import KafkaClients
from txstream.processor import Processor
from txstream.serde.avro import load_schema
from txstream.serde.registry import RegistryConfig
from txstream.task.spec import InputSource
from txstream.task.tables import TableSource

OFFSET_RESETS = ("earliest", "latest", "none")


@dataclass
class RunSettings:
    processor: Processor
    bootstrap_servers: str
    clients: KafkaClients
    app_id: str
    input_topics: list[str]
    output_topic: str | None
    dead_letter_topic: str | None
    guarantee: str
    auto_offset_reset: str
    max_records_per_partition: int
    trigger_interval: float
    lineage: bool
    master: str | None                   # None: spark-submit's, spark-defaults', else local[*] (spark/setup.py)
    key_schema: dict | None = None
    value_schema: dict | None = None
    output_key_schema: dict | None = None
    output_value_schema: dict | None = None
    # A schema registry (serde/registry.py): input read by the writer's schema id, output framed
    # with the id of its registered schema (resolved at start: driver/preflight.py check_registry).
    schema_registry: RegistryConfig | None = None
    registry_keys: bool = False            # input keys are registry-framed too
    output_key_schema_id: int | None = None
    output_value_schema_id: int | None = None
    producer_config: dict[str, Any] = field(default_factory=dict)
    consumer_config: dict[str, Any] = field(default_factory=dict)
    spark_conf: dict[str, str] = field(default_factory=dict)
    until_caught_up: bool = False
    max_batches: int | None = None
    transaction_timeout_s: float = 60.0
    # A batch still running after this long is cancelled and re-planned (a hung task must not
    # stall the run). None: five times the transaction timeout, which a healthy batch, sized
    # to a third of it, never comes near, even after Spark's task retries.
    batch_timeout_s: float | None = None
    idle_backoff_max_s: float = 2.0
    max_consecutive_failures: int = 8
    quiet: bool = False
    lenient_trailing_bytes: bool = False   # decode values with bytes left after the record (serde/avro.py)
    # Operations (driver/metrics.py): the /metrics port (None: not served) and the log lines.
    metrics_port: int | None = None
    spark_ui_port: int | None = None     # None: the UI only on a cluster master (spark/session.py)
    metrics_address: str = "0.0.0.0"
    log_format: str = "human"
    # Wide transforms (docs/wide-transforms.md): how a batch is published, into how many units,
    # and whether a non-deterministic transform is accepted knowingly.
    wide_mode: str = "units"
    output_units: int | None = None       # None: the number of input partitions
    allow_nondeterministic: bool = False
    # append | update | complete: state across batches; per-batch: an aggregation sees its batch
    # alone; None: Structured Streaming's default (append) for a stateful transform (docs/state.md)
    output_mode: str | None = None
    # Seconds without input after which the watermark follows wall-clock time (less the delay),
    # so an idle stream's windows close; None: only event time moves it (docs/state.md).
    watermark_idle_s: float | None = None
    # A unit snapshots its state once the changelog has grown this many records past its newest
    # snapshot: a restore reads at most that many after the snapshot (docs/state.md, "Snapshots").
    state_snapshot_every: int = 200_000
    allow_output_to_input_topics: bool = False   # a topic both read and written: a loop, accepted knowingly
    # Narrow batches: publishing tasks per batch (driver/slots.py); None: Spark's cores.
    task_slots: int | None = None
    producers_per_slot: int = 4           # transactional.ids per slot (driver/slots.py)
    first_batch_records: int = 10_000     # the run's first batch reads at most this many (driver/pacing.py)
    tables: tuple[TableSource, ...] = ()  # Processor.tables, their schemas loaded
    inputs: tuple[InputSource, ...] = ()  # Processor.inputs, their schemas loaded (empty: one input)

    def __post_init__(self) -> None:
        if self.batch_timeout_s is None:
            self.batch_timeout_s = 5 * self.transaction_timeout_s


OUTPUT_MODES = ("append", "update", "complete", "per-batch")


def check_wide_settings(mode: str, units: int | None) -> None:
    if mode not in WIDE_MODES:
        raise TransformError(f"wide mode must be one of {', '.join(WIDE_MODES)}, got {mode!r}")
    if units is not None and units < 1:
        raise TransformError("output units must be at least 1")


def check_against_guarantee(guarantee: str, producer: dict[str, Any], consumer: dict[str, Any]) -> None:
    """Refuse client properties that would quietly break the guarantee, naming the property.

    Checked on the driver when the run starts: inside a Spark task the same mistake surfaces as
    a producer error, or not at all (a read_uncommitted reader publishes aborted input)."""
    def refuse(name: str, value: Any, why: str) -> None:
        raise SettingsError(f"-X {name}={value} contradicts --guarantee {guarantee}: {why}. Remove it.")

    acks = producer.get("acks", producer.get("request.required.acks"))
    if acks is not None and str(acks).lower() not in ("all", "-1"):
        refuse("acks", acks, "txstream's producers are idempotent, which needs acks=all")
    idempotence = producer.get("enable.idempotence")
    if idempotence is not None and str(idempotence).lower() in ("false", "0", "no"):
        refuse("enable.idempotence", idempotence, "without idempotence a retried send can write a record twice")
    for name in ("max.in.flight.requests.per.connection", "max.in.flight"):
        value = producer.get(name)
        if value is not None and int(value) > 5:
            refuse(name, value, "an idempotent producer keeps order only with at most 5 requests in flight")
    isolation = consumer.get("isolation.level")
    if isolation is not None and str(isolation) != "read_committed":
        refuse("isolation.level", isolation, "reading uncommitted input would publish records of aborted "
               "transactions")
    if guarantee == EXACTLY_ONCE and "transactional.id" in producer:
        refuse("transactional.id", producer["transactional.id"], "txstream gives each input partition its own "
               "transactional.id (<app id>-<topic>-<partition>), which fences zombie attempts")


def load_processor(reference: str) -> type[Processor]:
    """`package.module:Class` (importable from the current directory) or `path/file.py:Class`."""
    module_ref, sep, class_name = reference.rpartition(":")
    if not sep or not module_ref or not class_name:
        raise SettingsError(f"PROCESSOR must look like package.module:ClassName or file.py:ClassName, got {reference!r}")
    if module_ref.endswith(".py") or os.sep in module_ref:
        path = Path(module_ref).resolve()
        if not path.exists():
            raise SettingsError(f"Processor file not found: {module_ref}")
        name = f"txstream_user_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.parent))
        spec.loader.exec_module(module)
        # Executors cannot import a module loaded from a path: ship its code by value.
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_ref)
        except ModuleNotFoundError as exc:
            raise SettingsError(f"Cannot import {module_ref!r} ({exc}); run from the directory that "
                                "contains it or pass a file path like path/to/file.py:ClassName") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise SettingsError(f"{module_ref} has no class {class_name!r}")
    if not (inspect.isclass(cls) and issubclass(cls, Processor)):
        raise SettingsError(f"{reference} is not a subclass of txstream.Processor")
    return cls


def default_app_id(cls: type[Processor]) -> str:
    words = re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()
    return f"txstream-{words}"


def _schema(value: str | None, cls: type[Processor]) -> dict | None:
    if not value:
        return None
    if value.lstrip().startswith("{"):
        return load_schema(value)
    candidates = [Path(value)]
    try:
        module_dir = Path(inspect.getfile(cls)).resolve().parent
        candidates += [module_dir / value, module_dir.parent / value]
    except TypeError:
        pass
    for candidate in candidates:
        if candidate.exists():
            return load_schema(str(candidate))
    return load_schema(value)  # raises the clear "not found" error


def _inputs(cls: type[Processor], given: list[str] | None) -> tuple[InputSource, ...]:
    """The processor's several input streams (Processor.inputs), none for a single input."""
    from txstream.processor import Input

    if not cls.inputs:
        return ()
    if given or cls.input_topics or cls.key_schema or cls.value_schema:
        raise SettingsError(f"{cls.__name__} declares inputs = {{...}}: each Input names its own topics and schemas "
                            "(input_topics, key_schema, value_schema and --input do not apply)")
    found, seen = [], set()
    for name, stream in cls.inputs.items():
        if not isinstance(stream, Input) or not name.isidentifier() or not stream.topics:
            raise SettingsError(f"{cls.__name__}.inputs maps names of transform's arguments to Input([topics], ...): "
                                f"got {name!r}: {stream!r}")
        twice = seen & set(stream.topics)
        if twice:
            raise SettingsError(f"the topic {sorted(twice)[0]!r} is in two of {cls.__name__}'s inputs: a topic is one "
                                "input's")
        seen |= set(stream.topics)
        found.append(InputSource(name, tuple(stream.topics), _schema(stream.key_schema, cls),
                                 _schema(stream.value_schema, cls)))
    return tuple(found)


def _tables(cls: type[Processor], inputs: list[str], registry: RegistryConfig | None,
            topics: dict[str, str]) -> tuple[TableSource, ...]:
    """The processor's tables, each topic as the command line's --table NAME=TOPIC names it."""
    from txstream.processor import Table

    unknown = sorted(set(topics) - set(cls.tables or {}))
    if unknown:
        raise SettingsError(f"--table {unknown[0]}=...: {cls.__name__} declares no table {unknown[0]!r} "
                            f"(its tables: {', '.join(sorted(cls.tables or {})) or 'none'})")
    found = []
    for name, table in (cls.tables or {}).items():
        if not isinstance(table, Table) or not name.isidentifier():
            raise SettingsError(f"{cls.__name__}.tables maps names of transform's arguments to Table(topic, ...): "
                                f"got {name!r}: {table!r}")
        if topics.get(name, table.topic) in inputs:
            raise SettingsError(f"the table {name!r} reads {topics.get(name, table.topic)!r}, which is also an input "
                                "topic: a topic is "
                                "read as a stream or kept as a table, not both")
        if registry is not None and (table.key_schema or table.value_schema):
            raise SettingsError(f"the table {name!r} declares a schema and the run reads through a schema registry: "
                                "tables decode with their own .avsc only, not registry-framed records (yet)")
        found.append(TableSource(name, topics.get(name, table.topic), _schema(table.key_schema, cls),
                                 _schema(table.value_schema, cls), table.broadcast))
    return tuple(found)


def registry_config(cls: type[Processor], extra: dict[str, Any]) -> RegistryConfig | None:
    """The run's schema registry: the command line's options (taken out of `extra`), else the
    processor's attributes; None without a URL."""
    url = extra.pop("schema_registry_url", None) or cls.schema_registry_url
    properties = extra.pop("schema_registry_properties", None) or {}
    strategy = extra.pop("subject_name_strategy", None) or cls.subject_name_strategy
    auto_register = extra.pop("auto_register", None)
    latest = extra.pop("use_latest_version", None)
    if not url:
        return None
    return RegistryConfig(url=url, properties=tuple(sorted((str(k), str(v)) for k, v in properties.items())),
                          strategy=strategy,
                          auto_register=cls.auto_register_schemas if auto_register is None else auto_register,
                          use_latest_version=cls.use_latest_version if latest is None else latest)


def resolve(cls: type[Processor], *, bootstrap_servers: str, app_id: str | None = None,
            inputs: list[str] | None = None, output: str | None = None, dead_letter: str | None = None,
            guarantee: str | None = None, auto_offset_reset: str | None = None,
            max_records_per_partition: int | None = None, trigger_interval: float | None = None,
            master: str | None = None, lineage: bool | None = None,
            librdkafka: dict[str, str] | None = None, spark_conf: dict[str, str] | None = None,
            schemas: dict[str, str] | None = None, table_topics: dict[str, str] | None = None,
            **extra: Any) -> RunSettings:
    """Processor declarations, overridden by whatever the command line gives."""
    schemas = schemas or {}
    guarantee = guarantee or cls.guarantee
    if guarantee not in GUARANTEES:
        raise SettingsError(f"guarantee must be one of {', '.join(GUARANTEES)}, got {guarantee!r}")
    reset = auto_offset_reset or (librdkafka or {}).get("auto.offset.reset") or cls.auto_offset_reset
    if reset not in OFFSET_RESETS:
        raise SettingsError(f"auto.offset.reset must be one of {', '.join(OFFSET_RESETS)}, got {reset!r}")
    streams = _inputs(cls, inputs)
    topics = [t for s in streams for t in s.topics] if streams else list(inputs or cls.input_topics)
    if not topics:
        raise SettingsError(f"{cls.__name__} declares no input_topics and none were given with --input")
    cap = max_records_per_partition or cls.max_records_per_partition
    if cap <= 0:
        raise SettingsError("max records per partition must be positive")
    # librdkafka properties: the processor's, then -X. Producer vs consumer is decided by name
    # prefix `producer.` / `consumer.`; unprefixed ones go to every client (kafka/config.py).
    clients = KafkaClients.from_properties(
        bootstrap_servers,
        {f"producer.{k}": v for k, v in cls.producer_config.items()},
        {f"consumer.{k}": v for k, v in cls.consumer_config.items()},
        {k: v for k, v in (librdkafka or {}).items() if k != "auto.offset.reset"})
    producer_config = clients.user_properties("producer")
    consumer_config = clients.user_properties("consumer")
    check_against_guarantee(guarantee, producer_config, consumer_config)
    timeout_ms = int(producer_config.get("transaction.timeout.ms", 60_000))
    # Wide transforms: the command line's, else the processor's.
    extra["wide_mode"] = extra.get("wide_mode") or cls.wide_mode
    extra["output_units"] = extra.get("output_units") or cls.output_units
    extra["allow_nondeterministic"] = bool(extra.get("allow_nondeterministic")) or cls.allow_nondeterministic
    check_wide_settings(extra["wide_mode"], extra["output_units"])
    extra["output_mode"] = extra.get("output_mode") or cls.output_mode
    extra["watermark_idle_s"] = extra.get("watermark_idle_s") or cls.watermark_idle_s
    extra["state_snapshot_every"] = extra.get("state_snapshot_every") or cls.state_snapshot_every
    if extra["state_snapshot_every"] <= 0:
        raise SettingsError(f"state_snapshot_every must be a positive number of changelog records, "
                            f"got {extra['state_snapshot_every']}")
    if extra["output_mode"] is not None and extra["output_mode"] not in OUTPUT_MODES:
        raise SettingsError(f"output mode must be one of {', '.join(OUTPUT_MODES)}, got {extra['output_mode']!r}")
    extra["task_slots"] = extra.get("task_slots") or cls.task_slots
    extra["producers_per_slot"] = extra.get("producers_per_slot") or cls.producers_per_slot
    output_topic, dead_letter_topic = output or cls.output_topic, dead_letter or cls.dead_letter_topic
    extra["allow_output_to_input_topics"] = (bool(extra.get("allow_output_to_input_topics"))
                                             or cls.allow_output_to_input_topics)
    for role, name in (("output topic", output_topic), ("dead-letter topic", dead_letter_topic)):
        if name in topics and not extra["allow_output_to_input_topics"]:
            raise SettingsError(
                f"the {role} {name!r} is also an input topic: the run would read its own output. "
                f"Set allow_output_to_input_topics = True on {cls.__name__} if that loop is intended.")
    extra["schema_registry"] = registry_config(cls, extra)
    first = extra.get("first_batch_records")
    extra["first_batch_records"] = cls.first_batch_records if first is None else first
    if extra["first_batch_records"] < 0:
        raise SettingsError("first batch records must be 0 (the first batch as big as the cap) or positive")
    extra["inputs"] = streams
    if streams and extra["schema_registry"] is not None:
        raise SettingsError(f"{cls.__name__} declares several inputs and the run reads through a schema registry: "
                            "each input decodes with its own .avsc only (for now)")
    extra["tables"] = _tables(cls, topics, extra["schema_registry"], table_topics or {})
    return RunSettings(
        processor=cls(),
        bootstrap_servers=bootstrap_servers,
        app_id=app_id or cls.app_id or default_app_id(cls),
        input_topics=topics,
        output_topic=output_topic,
        dead_letter_topic=dead_letter_topic,
        guarantee=guarantee,
        auto_offset_reset=reset,
        max_records_per_partition=cap,
        trigger_interval=trigger_interval if trigger_interval is not None else cls.trigger_interval,
        lineage=cls.lineage if lineage is None else lineage,
        master=master,
        key_schema=_schema(schemas.get("key") or cls.key_schema, cls),
        value_schema=_schema(schemas.get("value") or cls.value_schema, cls),
        output_key_schema=_schema(schemas.get("output_key") or cls.output_key_schema, cls),
        output_value_schema=_schema(schemas.get("output_value") or cls.output_value_schema, cls),
        clients=clients,
        producer_config=producer_config,
        consumer_config=consumer_config,
        spark_conf={**cls.spark_conf, **(spark_conf or {})},
        transaction_timeout_s=timeout_ms / 1000,
        **extra,
    )
