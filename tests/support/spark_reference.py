"""What Spark Structured Streaming itself emits for a query over given rows and batch cuts: the
reference the stateful engine's results are compared with (issue 60).

One JSON file per cut in a file source read with maxFilesPerTrigger=1 (one micro-batch per cut,
in the cuts' order), a memory sink, processAllAvailable (which also runs Spark's no-data batches).
The query gets the columns a txstream transform reads, `key` and `value` as binary, so one
function of the frame is both the processor's transform and Spark's query."""
from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable


def spark_emits(spark: Any, query: Callable[[Any], Any], cuts: list[list[tuple[str, str]]],
                output_mode: str) -> Counter:
    """The (key, value) rows Spark's own engine emits over `cuts` (each a list of (key, value)
    strings), counted: every emission of every batch."""
    from pyspark.sql import functions as F

    with tempfile.TemporaryDirectory(prefix="spark-reference-") as work:
        source = Path(work) / "source"
        source.mkdir()
        for i, cut in enumerate(cuts):
            path = source / f"cut-{i:05d}.json"
            path.write_text("".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in cut))
            os.utime(path, (1_000_000 + i, 1_000_000 + i))   # the file source takes files oldest first
        frame = (spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1)
                 .json(str(source))
                 .select(F.col("key").cast("binary").alias("key"), F.col("value").cast("binary").alias("value")))
        name = f"reference_{uuid.uuid4().hex[:8]}"
        running = (query(frame).writeStream.format("memory").queryName(name).outputMode(output_mode)
                   .option("checkpointLocation", str(Path(work) / "checkpoint")).start())
        try:
            running.processAllAvailable()
        finally:
            running.stop()
        rows = spark.table(name).collect()
        spark.catalog.dropTempView(name)
    return Counter((_text(r["key"]), _text(r["value"])) for r in rows)


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, (bytes, bytearray)) else value


def txstream_emits(records: list) -> Counter:
    """The same count of what a txstream run published (records read back from its output)."""
    return Counter((_text(r.key), _text(r.value)) for r in records)
