"""Output that names an input topic feeds the run its own output. A transform that keeps the
input's `topic` column does that without a word: txstream refuses it (rows, output_topic,
dead_letter_topic) unless the processor says the loop is intended."""
from __future__ import annotations

import pytest
from pyspark.sql import DataFrame

from processors.passthrough import PassThrough
from tests.support.kafka import committed, produce, read_all
from txstream.errors import SettingsError
from txstream.settings import resolve


class KeepsTheInputColumns(PassThrough):
    """The accident: every input column kept, `topic` (the input's) among them."""

    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", "value", "topic", "offset")


class LoopsKnowingly(KeepsTheInputColumns):
    allow_output_to_input_topics = True


def test_rows_that_name_an_input_topic_stop_the_run_and_publish_nothing(bootstrap_servers, make_topic,
                                                                       run_processor) -> None:
    source, sink = make_topic("loop-in", 2), make_topic("loop-out", 2)
    produce(bootstrap_servers, source, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(40)])
    app_id = f"loop-{source[-8:]}"
    with pytest.raises(Exception) as failure:
        run_processor(KeepsTheInputColumns, inputs=[source], output=sink, app_id=app_id)
    message = str(failure.value)
    assert f"an output row's `topic` is {source!r}, an input topic" in message, message[:2000]
    assert "allow_output_to_input_topics" in message, message[:2000]
    assert len(read_all(bootstrap_servers, source)) == 40
    assert read_all(bootstrap_servers, sink) == []
    assert committed(bootstrap_servers, app_id, source, 2) == {0: None, 1: None}


def test_an_intended_loop_publishes_to_the_input_topic(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink = make_topic("loop-ok-in", 1), make_topic("loop-ok-out", 1)
    produce(bootstrap_servers, source, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)])
    driver = run_processor(LoopsKnowingly, inputs=[source], output=sink, max_batches=1)
    assert driver.totals["records_out"] == 10
    assert sorted(r.value for r in read_all(bootstrap_servers, source)) == sorted(
        [f"v{i}".encode() for i in range(10)] * 2)
    assert read_all(bootstrap_servers, sink) == []


@pytest.mark.parametrize("role", ["output", "dead_letter"])
def test_an_output_or_dead_letter_topic_that_is_an_input_is_refused_at_start(role) -> None:
    topics = {"output": "enriched", role: "orders"}
    with pytest.raises(SettingsError, match="is also an input topic: the run would read its own output"):
        resolve(PassThrough, bootstrap_servers="localhost:1", inputs=["orders"], **topics)
    settings = resolve(LoopsKnowingly, bootstrap_servers="localhost:1", inputs=["orders"], **topics)
    assert settings.allow_output_to_input_topics
