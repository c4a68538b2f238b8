"""The differential suite's Spark session: the suite's own (tests/conftest.py `spark`), with the
settings both engines run these cases under, put back afterwards."""
from __future__ import annotations

import pytest

SETTINGS = {"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC",
            # The oracle's streaming queries: no schema files per stateful operator, no UI work.
            "spark.sql.streaming.stateStore.stateSchemaCheck": "false",
            "spark.sql.streaming.numRecentProgressUpdates": "1000"}


@pytest.fixture(scope="session")
def semantic_spark(spark):
    saved = {key: spark.conf.get(key, None) for key in SETTINGS}
    for key, value in SETTINGS.items():
        spark.conf.set(key, value)
    yield spark
    for key, value in saved.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)
