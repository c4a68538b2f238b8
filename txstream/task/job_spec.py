"""A batch's spec carried by its Spark job rather than inside the job's plan.

A narrow batch's DataFrame (reader, transform, publisher) used to embed the batch's ranges in the
reader's and the publisher's closures, so the driver rebuilt it every batch: the input frame, the
transform, the range-tag rewrite, the plan checks and Spark's analysis of each step, ~0.1 s of
driver time per batch over Py4J at 256 partitions. Instead the closures hold `FromJob`, and each
batch's `PublishSpec` (plans, group metadata, fencing) travels as a Spark local property of the
job that runs it: Spark hands a job's local properties to each of its tasks, retries and
speculative copies included, so a task always reads the spec of the job it belongs to. The
driver then builds the DataFrame once and runs it batch after batch while the batch's shape
stays the same (driver/loop.py `_batch_frame`).
"""
from __future__ import annotations

import base64
import pickle
import zlib
from dataclasses import dataclass
from typing import Any

from txstream.errors import InfrastructureError

JOB_SPEC_PROPERTY = "txstream.batch.spec"

_last: tuple[str, Any] | None = None   # per Python worker: the last property decoded, and its spec


@dataclass(frozen=True)
class FromJob:
    """Stands in a task's closure for the batch's spec: "read" (its ReadSpec) or "publish"."""

    part: str


def encode(spec: Any) -> str:
    """The local property's value for a batch's PublishSpec (text: local properties are strings)."""
    return base64.b64encode(zlib.compress(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL), 1)).decode("ascii")


def resolve(spec: Any) -> Any:
    """`spec` itself, or for a `FromJob` the part of the spec its job carries."""
    global _last
    if not isinstance(spec, FromJob):
        return spec
    from pyspark import TaskContext

    context = TaskContext.get()
    text = context.getLocalProperty(JOB_SPEC_PROPERTY) if context is not None else None
    if text is None:
        raise InfrastructureError(f"the task's Spark job carries no {JOB_SPEC_PROPERTY} property: a txstream "
                                  "batch job was run without its batch's spec (driver/loop.py)")
    if _last is None or _last[0] != text:
        _last = (text, pickle.loads(zlib.decompress(base64.b64decode(text))))
    publish = _last[1]
    return publish.read if spec.part == "read" else publish
