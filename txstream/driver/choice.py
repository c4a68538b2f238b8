"""Which `BatchProtocol` a run uses, chosen once from the transform's physical plan: narrow when
no row moves between partitions, wide otherwise (docs/wide-transforms.md). A new protocol is one
more branch here, and the loop does not change."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from txstream.driver.batches import BatchProtocol
from txstream.driver.checks import describe_wide, physical_plan, wide_parts
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
    and choose the protocol from the physical plan, said in the run's first lines. The transform
    is applied while its stateful calls are recorded (driver/stateful_query.py): a stateful
    operator, or an output mode, chooses the stateful protocol."""
    s = settings
    s.processor.batch_timestamp = datetime.now(timezone.utc)
    # Two (empty, never run) ranges: over a single partition Spark plans no shuffle even for
    # groupBy, and the check below would miss a wide transform. One topic of each input stream.
    topics = [i.topics[0] for i in s.inputs] or s.input_topics[:1]
    dry = [PartitionPlan(topic, p, 0, 0, None, transactional_id(s.app_id, topic, p)) for topic in topics for p in (0, 1)]

    def build(recorded: Any = None) -> tuple[Any, Any]:
        first = first_job(jobs, s, topic_partitions) if not s.inputs else None
        if first is not None:
            return first, first.out
        if recorded is not None:
            recorded.description = None   # what a failed first job recorded: the dry frame records again
        return None, jobs.output_frame(0, dry)

    if s.output_mode == "per-batch":
        first, frame = build()
    else:
        from txstream.driver.stateful import describe_operator

        units = s.output_units or sum(topic_partitions.values()) or 1
        description, (first, frame) = describe_operator(s, units, build)
        if description is not None:
            return _stateful(settings, specs, jobs, admin, topic_partitions, echo, description, frame)
    plan = physical_plan(frame)
    parts = wide_parts(plan)
    protocol: BatchProtocol
    if not parts and not s.inputs:   # several inputs: the wide protocol publishes their union
        protocol = NarrowBatches(s, specs, jobs, pacing, echo, first)
        echo(protocol.describe())
        return protocol
    from txstream.driver.determinism import check_deterministic
    from txstream.driver.wide import WideBatches

    echo(f"the transform is wide: {describe_wide(parts, plan)}" if parts else
         f"the transform reads {len(s.inputs)} input streams ({', '.join(i.name for i in s.inputs)}): published "
         "through the wide protocol")
    loose = check_deterministic(frame.drop("offset") if "offset" in frame.columns else frame,
                                s.allow_nondeterministic)
    for part in loose:
        echo(f"warning: not deterministic (allowed): {part}")
    protocol = WideBatches(s, specs, jobs, admin, sum(topic_partitions.values()), echo)
    echo(protocol.describe())
    return protocol


def _stateful(settings: RunSettings, specs: TaskSpecs, jobs: SparkJobs, admin: Any,
              topic_partitions: dict[str, int], echo: Callable[[str], None], description: Any,
              frame: Any) -> BatchProtocol:
    """State across batches (docs/state.md): the wide protocol whose units keep the state."""
    from txstream.driver.determinism import check_deterministic
    from txstream.driver.stateful import StatefulUnits
    from txstream.driver.wide import WideBatches

    s = settings
    # A unit's replay must merge the same partials: the state, like the output, depends on it.
    for part in check_deterministic(frame.drop("offset") if "offset" in frame.columns else frame,
                                    s.allow_nondeterministic):
        echo(f"warning: not deterministic (allowed): {part}")
    protocol = WideBatches(s, specs, jobs, admin, sum(topic_partitions.values()), echo,
                           state=StatefulUnits(s, specs, jobs, admin, echo, description))
    echo(protocol.describe())
    return protocol
