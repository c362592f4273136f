"""The executor's outcome counters start at zero for every active work type (the stats sampler), so
the first dead letters after an executor start are an ``increase()`` that ConnectorDeadLetters sees:
a counter series born at its first increment already holds its count in its first sample.

Control: with ``metrics.outcomes_known`` not called by the sampler (the code before), the zero
series are absent and this test fails."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.executor import seed


async def test_outcome_series_start_at_zero_for_every_active_work_type(db, adb) -> None:
    from connector.executor import metrics as m
    from connector.executor.work import stats_sampler

    noop = seed.python_work_type("tests.executor.effects:noop")
    seed.seed_pack(db, "zero-probe", {"first": noop, "second": noop})
    await stats_sampler.sample_once(adb, 1.0)
    samples = {
        (s.labels["pack"], s.labels["work_type"], s.labels["state"]): s.value
        for family in text_string_to_metric_families(generate_latest(m.REGISTRY).decode())
        if family.name == "connector_executor_outcomes"
        for s in family.samples
        if s.name == "connector_executor_outcomes_total" and s.labels.get("pack") == "zero-probe"
    }
    assert samples == {
        ("zero-probe", wt, state): 0.0
        for wt in ("first", "second")
        for state in ("succeeded", "retry", "dead")
    }
