"""A run's first batch is small (driver/loop.py `cap`): output soon after the start, even over a
backlog; then batches as big as the cap allows."""
from __future__ import annotations

import re
from collections import Counter

from processors.passthrough import PassThrough
from tests.support.kafka import produce, read_all

PARTITIONS, PER_PARTITION = 4, 5_000


def _records_in(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for m in (re.match(r"batch \d+ .* in (\d+) ", line) for line in lines) if m]


def test_first_batch_reads_first_batch_records_then_the_cap(bootstrap_servers, make_topic, run_processor) -> None:
    source = make_topic("backlog", partitions=PARTITIONS)
    values = [f"v-{p}-{i}".encode() for p in range(PARTITIONS) for i in range(PER_PARTITION)]
    for p in range(PARTITIONS):
        produce(bootstrap_servers, source, [(None, v) for v in values[p * PER_PARTITION:(p + 1) * PER_PARTITION]],
                partition=p)

    ramped_sink = make_topic("ramped", partitions=PARTITIONS)
    ramped = run_processor(PassThrough, inputs=[source], output=ramped_sink, first_batch_records=2_000)
    # 2,000 in all (500 per partition), then the rest (within the cap, 100,000 per partition).
    assert _records_in(ramped.lines) == [2_000, 18_000], ramped.lines
    assert Counter(r.value for r in read_all(bootstrap_servers, ramped_sink)) == Counter(values)

    whole_sink = make_topic("whole", partitions=PARTITIONS)
    whole = run_processor(PassThrough, inputs=[source], output=whole_sink, first_batch_records=0)
    assert _records_in(whole.lines) == [20_000], whole.lines
    assert Counter(r.value for r in read_all(bootstrap_servers, whole_sink)) == Counter(values)
