"""Which `BatchProtocol` a run uses, chosen once from the transform's physical plan: narrow when
no row moves between partitions, wide otherwise (docs/wide-transforms.md). A new protocol is one
more branch here, and the loop does not change."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from txstream.driver.batches import BatchProtocol
from txstream.driver.checks import describe_wide, wide_parts
from txstream.driver.jobs import SparkJobs
from txstream.driver.narrow import NarrowBatches, first_job
from txstream.driver.pacing import Pacing
from txstream.driver.planning import transactional_id
from txstream.driver.specs import TaskSpecs
from txstream.settings import RunSettings
from txstream.task.spec import PartitionPlan


def choose_protocol(settings: RunSettings, specs: TaskSpecs, jobs: SparkJobs, pacing: Pacing, admin: Any,
                    topic_partitions: dict[str, int], echo: Callable[[str], None]) -> BatchProtocol:
    """Refuse an unpublishable output before anything is read (the transform's output checked),
    and choose the protocol from the physical plan, said in the run's first lines."""
    s = settings
    s.processor.batch_timestamp = datetime.now(timezone.utc)
    if s.output_mode != "per-batch":
        stateful = _stateful(settings, specs, jobs, admin, topic_partitions, echo)
        if stateful is not None:
            return stateful
    first = first_job(jobs, s, topic_partitions)
    if first is not None:
        frame = first.out
    else:
        topic = s.input_topics[0]
        # Two (empty, never run) ranges: over a single partition Spark plans no shuffle even
        # for groupBy, and the check below would miss a wide transform.
        dry = [PartitionPlan(topic, p, 0, 0, None, transactional_id(s.app_id, topic, p)) for p in (0, 1)]
        frame = jobs.output_frame(0, dry)
    parts = wide_parts(frame)
    protocol: BatchProtocol
    if not parts:
        protocol = NarrowBatches(s, specs, jobs, pacing, echo, first)
        echo(protocol.describe())
        return protocol
    from txstream.driver.determinism import check_deterministic
    from txstream.driver.wide import WideBatches

    echo(f"the transform is wide: {describe_wide(parts)}")
    loose = check_deterministic(frame.drop("offset") if "offset" in frame.columns else frame,
                                s.allow_nondeterministic)
    for part in loose:
        echo(f"warning: not deterministic (allowed): {part}")
    protocol = WideBatches(s, specs, jobs, admin, sum(topic_partitions.values()), echo)
    echo(protocol.describe())
    return protocol


def _stateful(settings: RunSettings, specs: TaskSpecs, jobs: SparkJobs, admin: Any,
              topic_partitions: dict[str, int], echo: Callable[[str], None]) -> BatchProtocol | None:
    """State across batches (docs/state.md): the wide protocol whose units keep the state; None
    when the transform has no stateful operator and no output mode asks for one."""
    from txstream.driver.stateful import StatefulBatches, describe_operator

    s = settings
    inputs = sum(topic_partitions.values())
    units = s.output_units or inputs or 1
    topic = s.input_topics[0]
    dry = [PartitionPlan(topic, p, 0, 0, None, transactional_id(s.app_id, topic, p)) for p in (0, 1)]
    description, frame = describe_operator(s, units, jobs, dry)
    if description is None:
        return None
    from txstream.driver.determinism import check_deterministic

    # A unit's replay must merge the same partials: the state, like the output, depends on it.
    for part in check_deterministic(frame.drop("offset") if "offset" in frame.columns else frame,
                                    s.allow_nondeterministic):
        echo(f"warning: not deterministic (allowed): {part}")
    protocol = StatefulBatches(s, specs, jobs, admin, inputs, echo, description)
    echo(protocol.describe())
    return protocol
