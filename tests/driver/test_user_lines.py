"""What a run says to its user, without a broker: why a transform is wide in words (not a plan
fragment), and the batch line (no unexplained statuses; the driver's time for wide batches too)."""
from __future__ import annotations

from txstream.driver.checks import describe_wide
from txstream.driver.report import BatchReport
from txstream.task.spec import PartitionPlan


def test_a_wide_transform_is_described_in_words() -> None:
    cases = {
        "+- Exchange hashpartitioning(country#28, 8), ENSURE_REQUIREMENTS, [plan_id=23]":
            "it brings rows together by country (a shuffle)",
        "Exchange hashpartitioning(_groupingexpression#28, 200), ENSURE_REQUIREMENTS, [plan_id=5]":
            "it brings rows together by a computed key (a shuffle)",
        "Exchange hashpartitioning(customer_id#3, id#7L, 200), ENSURE_REQUIREMENTS, [plan_id=9]":
            "it brings rows together by customer_id, id (a shuffle)",
        "Exchange rangepartitioning(amount#4 ASC NULLS FIRST, 200), ENSURE_REQUIREMENTS, [plan_id=2]":
            "it sorts rows by amount across partitions (a shuffle)",
        "Exchange SinglePartition, ENSURE_REQUIREMENTS, [plan_id=11]":
            "it brings every row into one partition (a global aggregate, sort or limit)",
        "Exchange RoundRobinPartitioning(4), REPARTITION_BY_NUM, [plan_id=3]": "it repartitions the rows (a shuffle)",
        "Coalesce 1": "it merges partitions (coalesce)",
    }
    for part, words in cases.items():
        assert describe_wide([part]) == words, part


def test_a_computed_grouping_key_is_named_from_the_plan() -> None:
    """groupBy(F.col("value.customer_id").alias(...)): Spark shuffles by `_groupingexpression#7`,
    which the plan's Project computes; the user is told the expression (Spark 4.3's plan text)."""
    plan = ("+- HashAggregate(keys=[_groupingexpression#7], functions=[count(1)], output=[customer_id#1, count(1)#4L])\n"
            "   +- Exchange hashpartitioning(_groupingexpression#7, 200), ENSURE_REQUIREMENTS, [plan_id=15]\n"
            "      +- Project [amount#3, concat(value#0.a, -, upper(value#0.b)) AS _groupingexpression#70, "
            "value#0.customer_id AS _groupingexpression#7]\n")
    part = "Exchange hashpartitioning(_groupingexpression#7, 200), ENSURE_REQUIREMENTS, [plan_id=15]"
    assert describe_wide([part], plan) == "it brings rows together by value.customer_id (a shuffle)"
    both = "Exchange hashpartitioning(_groupingexpression#70, _groupingexpression#7, 200), ENSURE_REQUIREMENTS"
    assert describe_wide([both], plan) == \
        "it brings rows together by concat(value.a, -, upper(value.b)), value.customer_id (a shuffle)"


def row(index: int, status: str, records: int = 10) -> dict:
    return dict(index=index, status=status, records_in=records, records_out=records, dead_letters=0,
                committed=-1, read_s=0.1, upstream_s=0.2, produce_s=0.05, commit_s=0.02, init_s=0.0,
                attempts=1, message="")


def test_the_batch_line_names_only_what_needs_attention_and_the_drivers_time() -> None:
    plans = [PartitionPlan("orders", p, 0, 10, None, "") for p in range(2)]
    wide = BatchReport(3, plans, [row(0, "committed"), row(1, "empty", 0), row(-1, "committed")], 0.5,
                       reads={("orders", 0): (10, 0), ("orders", 1): (10, 0)}, driver_s=0.25)
    line = wide.line()
    assert "empty" not in line and "driver 0.25" in line, line
    stale = BatchReport(4, plans, [row(0, "committed"), row(1, "stale-plan", 0)], 0.5, driver_s=0.1)
    assert "stale-plan=1" in stale.line(), stale.line()
