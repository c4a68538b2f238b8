"""`txstream verify` against a real broker: inputs from a plain producer, "outputs" crafted by
transactional producers carrying txstream's lineage headers, exactly as the publisher writes them.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition

from txstream.cli import main as cli
from txstream.kafka import headers as hdr
from txstream.tools.verify import AuditError, audit

# ---------------------------------------------------------------------------------------------
# Crafting topics
# ---------------------------------------------------------------------------------------------

def write_inputs(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, value=b"in-%d" % i, partition=partition)
        if i % 50_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


class Publisher:
    """A transactional producer standing in for txstream's publisher: one transaction is one
    publication, every record carries lineage and the publication id."""

    def __init__(self, bootstrap: str, txid: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.producer = Producer({"bootstrap.servers": bootstrap,
                                  "transactional.id": txid or f"verify-test-{uuid.uuid4().hex}",
                                  "linger.ms": 5})
        self.producer.init_transactions(30)

    def publish(self, topic: str, sources: list[tuple[str, int, int]], *, fan_out: int = 1,
                abort: bool = False, publication: bool = True, dead_letter: bool = False,
                commit_offsets: tuple[str, dict[tuple[str, int], int]] | None = None,
                five: bool = False, seq: bool = True, repeat: tuple[int, int] | None = None) -> str:
        """Records as txstream writes them (one `txstream.lineage` header), or with `five` (or
        without a `publication`) in the five-header format older output has, where `seq`
        stamps each record's position (the oldest output has none). `repeat=(i, j)`: produce
        source i's j-th record a second time, verbatim (same headers), in the same transaction."""
        pub_id = uuid.uuid4().hex
        five = five or not publication
        position = 0
        self.producer.begin_transaction()
        for i, (src_topic, src_partition, src_offset) in enumerate(sources):
            headers = five_headers(src_topic, src_partition, src_offset) if five else []
            if publication and five:
                headers.append((hdr.PUBLICATION, pub_id.encode()))
            for j in range(fan_out):
                if five:
                    stamped = headers + ([(hdr.PUBLICATION_SEQ, str(position).encode())] if seq else [])
                else:
                    stamped = [(hdr.LINEAGE, hdr.lineage_value(src_topic, src_partition, src_offset,
                                                               pub_id, position))]
                if dead_letter:
                    stamped += [(hdr.DLQ_STAGE, b"transform"), (hdr.DLQ_ERROR, b"ValueError: bad")]
                position += 1
                self.producer.produce(topic, value=b"out-%d-%d" % (i, j), headers=stamped)
                if repeat == (i, j):
                    self.producer.produce(topic, value=b"out-%d-%d" % (i, j), headers=stamped)
            if i % 50_000 == 0:
                self.producer.poll(0)
        if commit_offsets:
            group, offsets = commit_offsets
            member = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group})
            try:
                self.producer.send_offsets_to_transaction(
                    [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    member.consumer_group_metadata(), 30)
            finally:
                member.close()
        if abort:
            self.producer.abort_transaction(30)
        else:
            self.producer.commit_transaction(60)
        return pub_id


def five_headers(topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    """The five-header format's source headers (output written before `txstream.lineage`)."""
    return [(hdr.SOURCE_TOPIC, topic.encode()), (hdr.SOURCE_PARTITION, str(partition).encode()),
            (hdr.SOURCE_OFFSET, str(offset).encode())]


def src(topic: str, offsets, partition: int = 0) -> list[tuple[str, int, int]]:
    return [(topic, partition, o) for o in offsets]


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["verify", *args], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def topics(bootstrap_servers: str, make_topic):
    """An input with 10 records, an empty output and dead-letter topic."""
    inp, out, dlq = make_topic("in"), make_topic("out"), make_topic("dlq")
    write_inputs(bootstrap_servers, inp, 10)
    return inp, out, dlq


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------

def test_clean_one_to_one_run_exits_0(bootstrap_servers: str, topics) -> None:
    inp, out, dlq = topics
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, range(0, 6)))
    pub.publish(out, src(inp, range(6, 10)))

    code, output = run_cli("--input", inp, "--output", out, "--dead-letter", dlq, "--one-to-one",
                           "--bootstrap-servers", bootstrap_servers)
    assert code == 0, output
    assert "CLEAN" in output and f"{inp}[0]" in output

    report = audit(bootstrap_servers, [inp], [out], dead_letter=dlq, one_to_one=True)
    row, = report.partitions
    assert (row.start, row.end, row.consumed, row.outputs, row.duplicates, row.gaps) == (0, 10, 10, 10, 0, 0)
    assert report.clean


@pytest.mark.parametrize("five", [False, True], ids=["txstream.lineage", "five headers"])
def test_offset_published_in_two_committed_transactions_is_a_duplicate(bootstrap_servers: str, topics,
                                                                       five: bool) -> None:
    inp, out, _ = topics
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, range(0, 10)), five=five)
    pub.publish(out, src(inp, [3]), five=five)  # a retried range that was already published

    report = audit(bootstrap_servers, [inp], [out])
    row, = report.partitions
    assert row.duplicates == 1 and row.duplicate_offsets == [3]
    assert row.outputs == 11
    assert not report.clean

    code, output = run_cli("--input", inp, "--output", out, "--json",
                           "--bootstrap-servers", bootstrap_servers)
    assert code == 1
    data = json.loads(output)
    assert data["clean"] is False and data["totals"]["duplicates"] == 1
    assert data["partitions"][0]["duplicate_offsets"] == [3]


def test_duplicate_in_an_aborted_transaction_is_not_seen(bootstrap_servers: str, topics) -> None:
    inp, out, _ = topics
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, range(0, 10)))
    pub.publish(out, src(inp, [3, 4, 5]), abort=True)   # fenced / failed attempt, aborted

    report = audit(bootstrap_servers, [inp], [out], one_to_one=True)
    row, = report.partitions
    assert (row.outputs, row.duplicates, row.gaps) == (10, 0, 0)
    assert report.clean
    code, output = run_cli("--input", inp, "--output", out, "--one-to-one",
                           "--bootstrap-servers", bootstrap_servers)
    assert code == 0, output


@pytest.mark.parametrize("five", [False, True], ids=["txstream.lineage", "five headers"])
def test_fan_out_within_one_publication_is_not_a_duplicate(bootstrap_servers: str, topics, five: bool) -> None:
    inp, out, _ = topics
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, range(0, 10)), fan_out=3, five=five)

    report = audit(bootstrap_servers, [inp], [out])
    row, = report.partitions
    assert (row.consumed, row.outputs, row.duplicates) == (10, 30, 0)
    assert report.clean


def test_without_publication_ids_one_to_one_flags_second_outputs(bootstrap_servers: str, topics) -> None:
    inp, out, _ = topics
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, range(0, 10)), publication=False)
    pub.publish(out, src(inp, [7]), publication=False)

    assert audit(bootstrap_servers, [inp], [out]).clean         # fan-out or duplicate: unknown
    report = audit(bootstrap_servers, [inp], [out], one_to_one=True)
    assert report.partitions[0].duplicate_offsets == [7]
    assert report.without_publication == 11


def test_missing_offset_is_a_gap_with_one_to_one(bootstrap_servers: str, topics) -> None:
    inp, out, dlq = topics
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, [o for o in range(10) if o != 4]))

    assert audit(bootstrap_servers, [inp], [out]).clean          # gaps only with --one-to-one
    code, output = run_cli("--input", inp, "--output", out, "--dead-letter", dlq, "--one-to-one",
                           "--bootstrap-servers", bootstrap_servers)
    assert code == 1, output
    assert f"gap {inp}[0] at offsets 4" in output
    report = audit(bootstrap_servers, [inp], [out], dead_letter=dlq, one_to_one=True)
    assert report.partitions[0].gaps == 1 and report.partitions[0].gap_offsets == [4]


def test_dead_lettered_offset_is_not_a_gap(bootstrap_servers: str, topics) -> None:
    inp, out, dlq = topics
    pub = Publisher(bootstrap_servers)
    pub.producer.begin_transaction()  # one publication: 9 outputs and one dead letter, as in txstream
    pub_id = "pub-1"
    for o in range(10):
        headers = [(hdr.LINEAGE, hdr.lineage_value(inp, 0, o, pub_id, o))]
        if o == 4:
            # As txstream writes it: the input's own headers first (here an upstream app's
            # lineage, in the five-header format an older txstream wrote), then this app's
            # lineage and error.
            upstream = five_headers("upstream", 0, 99) + [(hdr.PUBLICATION, b"upstream-pub")]
            pub.producer.produce(dlq, value=b"bad", headers=upstream + headers + [
                (hdr.DLQ_STAGE, b"decode"), (hdr.DLQ_ERROR, b"not Avro")])
        else:
            pub.producer.produce(out, value=b"ok", headers=headers)
    pub.producer.commit_transaction(30)

    report = audit(bootstrap_servers, [inp], [out], dead_letter=dlq, one_to_one=True)
    row, = report.partitions
    assert (row.outputs, row.dead_lettered, row.gaps, row.duplicates) == (9, 1, 0, 0)
    code, output = run_cli("--input", inp, "--output", out, "--dead-letter", dlq, "--one-to-one",
                           "--bootstrap-servers", bootstrap_servers)
    assert code == 0, output


def test_app_id_limits_the_range_to_the_committed_offset(bootstrap_servers: str, topics) -> None:
    inp, out, dlq = topics
    app = f"verify-app-{uuid.uuid4().hex[:8]}"
    pub = Publisher(bootstrap_servers)
    # The app published and committed [0, 6); offsets 6..9 are not processed yet.
    pub.publish(out, src(inp, range(0, 6)), commit_offsets=(app, {(inp, 0): 6}))

    report = audit(bootstrap_servers, [inp], [out], dead_letter=dlq, app_id=app, one_to_one=True)
    row, = report.partitions
    assert (row.start, row.end, row.consumed, row.outputs, row.gaps) == (0, 6, 6, 6, 0)
    assert report.clean
    # Without the app id the whole input is audited: 6..9 are gaps.
    report = audit(bootstrap_servers, [inp], [out], dead_letter=dlq, one_to_one=True)
    assert report.partitions[0].gap_offsets == [6, 7, 8, 9]

    # Output that ran ahead of the committed offset is reported as unexpected (not a gap).
    Publisher(bootstrap_servers).publish(out, src(inp, [8]))
    report = audit(bootstrap_servers, [inp], [out], app_id=app, one_to_one=True)
    assert report.partitions[0].unexpected_offsets == [8] and report.clean
    code, output = run_cli("--input", inp, "--output", out, "--app-id", app, "--one-to-one",
                           "--bootstrap-servers", bootstrap_servers)
    assert code == 0 and f"unexpected {inp}[0] at offsets 8" in output


def test_lineage_outside_the_inputs_is_unexpected(bootstrap_servers: str, topics) -> None:
    inp, out, _ = topics
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, range(10)) + [("some-other-topic", 0, 1)] + src(inp, [10_000]))

    report = audit(bootstrap_servers, [inp], [out])
    assert report.unexpected_elsewhere == 1
    assert report.unexpected_elsewhere_samples == [("some-other-topic", 0, 1)]
    assert report.partitions[0].unexpected_offsets == [10_000]
    assert report.totals["unexpected"] == 2
    assert report.partitions[0].outputs == 10


def test_input_with_aborted_transactions_and_control_records(bootstrap_servers: str, make_topic) -> None:
    """Offsets jump over commit/abort markers and aborted data, also at the very end of the log:
    the audit counts only committed input and stops on position, without stalling."""
    inp, out = make_topic("in"), make_topic("out")
    writer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": f"in-{uuid.uuid4().hex}"})
    writer.init_transactions(30)
    visible: list[int] = []
    for committed in (True, False, True, False):       # ends with an aborted transaction
        writer.begin_transaction()
        for _ in range(5):
            writer.produce(inp, value=b"x")
        writer.flush(30)
        if committed:
            writer.commit_transaction(30)
        else:
            writer.abort_transaction(30)
    # The offsets read_committed sees: 0-4, [marker 5], aborted 6-10, [11], 12-16, [17], ...
    reader = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": uuid.uuid4().hex,
                       "isolation.level": "read_committed"})
    reader.assign([TopicPartition(inp, 0, 0)])
    while len(visible) < 10:
        msg = reader.poll(10)
        assert msg is not None
        if not msg.error():
            visible.append(msg.offset())
    reader.close()
    assert visible == [0, 1, 2, 3, 4, 12, 13, 14, 15, 16]

    Publisher(bootstrap_servers).publish(out, src(inp, visible))
    began = time.monotonic()
    report = audit(bootstrap_servers, [inp], [out], one_to_one=True, timeout=20)
    assert time.monotonic() - began < 15          # did not wait out the stall timeout
    row, = report.partitions
    assert (row.start, row.end) == (0, 24)         # LSO past the last abort marker
    assert (row.consumed, row.outputs, row.gaps, row.duplicates, row.unexpected) == (10, 10, 0, 0, 0)

    # An output naming an aborted input record points at nothing that was consumed.
    Publisher(bootstrap_servers).publish(out, src(inp, [7]))
    assert audit(bootstrap_servers, [inp], [out], one_to_one=True).partitions[0].unexpected_offsets == [7]


def test_several_partitions_and_topics(bootstrap_servers: str, make_topic) -> None:
    inp1, inp2 = make_topic("in", partitions=3), make_topic("in")
    out1, out2 = make_topic("out", partitions=2), make_topic("out")
    for p in range(3):
        write_inputs(bootstrap_servers, inp1, 4 + p, partition=p)
    write_inputs(bootstrap_servers, inp2, 5)
    pub = Publisher(bootstrap_servers)
    for p in range(3):
        pub.publish(out1, src(inp1, range(4 + p), partition=p))
    pub.publish(out2, src(inp2, range(5)))
    pub.publish(out2, src(inp1, [1], partition=2))     # duplicate of inp1[2]@1, on another topic

    report = audit(bootstrap_servers, [inp1, inp2], [out1, out2], one_to_one=True)
    assert [(r.name, r.consumed, r.outputs, r.duplicates) for r in report.partitions] == [
        (f"{inp1}[0]", 4, 4, 0), (f"{inp1}[1]", 5, 5, 0), (f"{inp1}[2]", 6, 7, 1), (f"{inp2}[0]", 5, 5, 0)]
    code, _ = run_cli("--input", inp1, "--input", inp2, "--output", out1, "--output", out2,
                      "--bootstrap-servers", bootstrap_servers)
    assert code == 1


def test_usage_and_connection_errors_exit_2_without_traceback(bootstrap_servers: str, topics) -> None:
    inp, out, _ = topics
    code, output = run_cli("--input", inp, "--output", "no-such-topic-xyz",
                           "--bootstrap-servers", bootstrap_servers)
    assert code == 2 and "does not exist" in output
    code, output = run_cli("--input", inp, "--output", inp, "--bootstrap-servers", bootstrap_servers)
    assert code == 2 and "two roles" in output
    code, output = run_cli("--output", out, "--bootstrap-servers", bootstrap_servers)
    assert code == 2                                    # missing --input: click usage error
    proc = subprocess.run([sys.executable, "-m", "txstream.cli", "verify", "--input", inp, "--output",
                           out, "--bootstrap-servers", "localhost:1", "--timeout", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Cannot reach Kafka at localhost:1" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(AuditError):
        audit(bootstrap_servers, [inp], ["no-such-topic-xyz"])


def test_a_hundred_thousand_records_audit_quickly(bootstrap_servers: str, make_topic) -> None:
    n = 100_000
    inp, out = make_topic("in", partitions=2), make_topic("out", partitions=2)
    write_inputs(bootstrap_servers, inp, n // 2, partition=0)
    write_inputs(bootstrap_servers, inp, n // 2, partition=1)
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, range(n // 2), partition=0))
    pub.publish(out, src(inp, range(n // 2), partition=1))
    began = time.monotonic()
    report = audit(bootstrap_servers, [inp], [out], one_to_one=True)
    took = time.monotonic() - began
    assert report.clean and report.totals["consumed"] == n and report.totals["outputs"] == n
    assert report.records_read == 2 * n
    assert took < 30, f"audit of {2 * n} records took {took:.1f}s"


def test_an_open_transaction_ends_the_audit_at_the_last_stable_offset(bootstrap_servers: str, topics) -> None:
    inp, out, _ = topics
    pub = Publisher(bootstrap_servers)
    pub.publish(out, src(inp, range(10)))
    stuck = Publisher(bootstrap_servers)
    stuck.producer.begin_transaction()
    for o in range(3):     # a duplicate in flight: read_committed must not see it
        stuck.producer.produce(out, value=b"x", headers=[(hdr.LINEAGE, hdr.lineage_value(inp, 0, o, "p2", o))])
    stuck.producer.flush(30)
    try:
        began = time.monotonic()
        report = audit(bootstrap_servers, [inp], [out], one_to_one=True, timeout=2)
        assert time.monotonic() - began < 10
        assert report.open_transactions == [f"{out}[0]"] and report.clean
        assert report.partitions[0].outputs == 10
        assert "transactions still open" in report.table()
    finally:
        stuck.producer.abort_transaction(30)


# ---------------------------------------------------------------------------------------------
# Verbatim duplicates (issue 12): a record repeated with the same publication id
# ---------------------------------------------------------------------------------------------

def test_a_verbatim_copy_of_a_published_record_is_a_duplicate(bootstrap_servers, make_topic):
    inp, out = make_topic("in"), make_topic("out")
    write_inputs(bootstrap_servers, inp, 10)
    Publisher(bootstrap_servers).publish(out, src(inp, range(10)), repeat=(4, 0))
    for one_to_one in (False, True):
        report = audit(bootstrap_servers, inp, out, one_to_one=one_to_one)
        assert not report.clean and report.partitions[0].duplicate_offsets == [4], report.table()


def test_a_fan_out_is_clean_and_a_copy_of_one_of_its_records_is_not(bootstrap_servers, make_topic):
    inp, clean_out, copied_out = make_topic("in"), make_topic("out"), make_topic("out2")
    write_inputs(bootstrap_servers, inp, 10)
    publisher = Publisher(bootstrap_servers)
    publisher.publish(clean_out, src(inp, range(10)), fan_out=3)
    report = audit(bootstrap_servers, inp, clean_out)
    assert report.clean and report.totals["outputs"] == 30, report.table()
    publisher.publish(copied_out, src(inp, range(10)), fan_out=3, repeat=(7, 2))
    report = audit(bootstrap_servers, inp, copied_out)
    assert not report.clean and report.partitions[0].duplicate_offsets == [7], report.table()


def test_under_one_to_one_a_second_record_of_one_publication_is_a_duplicate(bootstrap_servers, make_topic):
    # Output written before positions existed: same publication, no seq. A 1:1 processor's
    # second record for an offset is a duplicate even so.
    inp, out = make_topic("in"), make_topic("out")
    write_inputs(bootstrap_servers, inp, 5)
    Publisher(bootstrap_servers).publish(out, src(inp, range(5)), five=True, seq=False, repeat=(2, 0))
    assert audit(bootstrap_servers, inp, out).clean  # without seq and without --one-to-one: cannot tell
    report = audit(bootstrap_servers, inp, out, one_to_one=True)
    assert report.partitions[0].duplicate_offsets == [2], report.table()


# ---------------------------------------------------------------------------------------------
# Records whose lineage has no source offset, publications, records from outside txstream
# ---------------------------------------------------------------------------------------------

def test_records_without_an_offset_are_audited_by_publication_and_position(bootstrap_servers, make_topic):
    inp, clean_out, copied_out = make_topic("in"), make_topic("out"), make_topic("out2")
    write_inputs(bootstrap_servers, inp, 5)
    offsetless = [(inp, 0, None)] * 5
    publisher = Publisher(bootstrap_servers)
    publisher.publish(clean_out, offsetless)
    report = audit(bootstrap_servers, inp, clean_out)
    assert report.clean and report.totals["without_offset"] == 5 and report.without_lineage == 0, report.table()
    assert "not the offset" in report.table() and "no txstream lineage" not in report.table()

    publisher.publish(copied_out, offsetless, repeat=(2, 0))
    code, output = run_cli("--input", inp, "--output", copied_out, "--bootstrap-servers", bootstrap_servers)
    assert code == 1, output
    assert f"duplicate: {copied_out}[0]@3 repeats publication" in output and "position 2" in output, output
    assert audit(bootstrap_servers, inp, copied_out).partitions[0].duplicates == 1


def test_a_publication_with_a_missing_position_is_incomplete(bootstrap_servers, make_topic):
    inp, out = make_topic("in"), make_topic("out")
    write_inputs(bootstrap_servers, inp, 4)
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for position in (0, 1, 3):   # position 2 went to a topic verify is not given
        producer.produce(out, b"x", headers=[(hdr.LINEAGE, hdr.lineage_value(inp, 0, position, "p1", position))])
    assert producer.flush(30) == 0
    code, output = run_cli("--input", inp, "--output", out, "--bootstrap-servers", bootstrap_servers)
    assert code == 1 and "incomplete: publication p1: positions 2 not found" in output, output


def test_records_from_outside_txstream_are_noted_not_audited(bootstrap_servers, topics):
    inp, out, dlq = topics
    Publisher(bootstrap_servers).publish(out, src(inp, range(10)))
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    producer.produce(out, b"from elsewhere")
    producer.produce(out, b"from elsewhere", headers=[(hdr.LINEAGE, b"not ours")])
    assert producer.flush(30) == 0
    for flag in ("--dead-letter-topic", "--dead-letter"):
        code, output = run_cli("--input", inp, "--output", out, flag, dlq, "--bootstrap-servers", bootstrap_servers)
        assert code == 0, output
        assert "note: 2 output/dead-letter record(s) carry no txstream lineage header (written outside txstream" \
            in output, output
    code, output = run_cli("--input", inp, "--output", out, "--format", "json", "--bootstrap-servers",
                           bootstrap_servers)
    data = json.loads(output)
    assert code == 0 and data["without_lineage"] == 2 and data["totals"]["outputs"] == 10, data
    assert data["verdict"].startswith("CLEAN")
