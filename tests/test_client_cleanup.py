"""The test run's own hygiene: no Kafka client is left for the interpreter's shutdown to destroy
(CI once saw pytest die of a segmentation fault after an all-passed summary, a client left open
retrying a broker that had stopped)."""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.conftest import _SessionAdmin

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_clients_a_cache_keeps_are_found_and_closed(bootstrap_servers: str) -> None:
    """In a process of its own: the sweep would otherwise close this run's cached clients too."""
    script = textwrap.dedent(f"""
        import confluent_kafka as ck
        from tests.support.kafka import close_clients_left_open
        CACHE = {{}}   # like a Python worker's (task/publish.py, task/reading.py)
        CACHE["p"] = ck.Producer({{"bootstrap.servers": "{bootstrap_servers}", "linger.ms": 60000,
                                  "on_delivery": lambda err, msg: None}})
        CACHE["p"].produce("never-created-topic", b"queued, never sent")
        CACHE["c"] = ck.Consumer({{"bootstrap.servers": "{bootstrap_servers}", "group.id": "cleanup",
                                  "logger": __import__("logging").getLogger("x")}})
        CACHE["c"].committed([ck.TopicPartition("never-created-topic", 0)], timeout=10)
        print(sorted(close_clients_left_open()))
        for name, call in (("p", lambda: CACHE["p"].produce("t", b"x")), ("c", lambda: CACHE["c"].poll(0))):
            try:
                call()
                print(name, "still open")
            except RuntimeError:
                print(name, "closed")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["['Consumer', 'Producer']", "p closed", "c closed"], done.stdout


def test_the_session_admin_goes_when_its_fixture_ends_whoever_holds_the_holder() -> None:
    admin = AdminClient({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    client = weakref.ref(admin)
    holder = _SessionAdmin(admin)
    del admin
    kept = [lambda: holder]   # a test's closure outliving the test
    assert holder.list_topics is not None   # delegates while the broker runs
    holder.release()
    gc.collect()
    assert client() is None and kept
    with pytest.raises(RuntimeError, match="broker stopped"):
        holder.list_topics(timeout=1)
