"""The WorkItem path of one executor process: one actor per module, sharing the engine's state.

``engine`` (state, start/stop), ``claimer`` (with ``claim_levels``: which claim statement each
group needs), ``runner`` (the worker slots), ``finalizer``, ``lease_keeper``, ``reclaimer``,
``listener`` (wake-ups), ``scheduler`` (fairness and admission), ``inflight`` (the executor's record
of a claimed item), ``stats_sampler`` (queue gauges), ``doors`` (what each actor may read and change
of the engine's state).
Statements: ``connector.common.store``. See docs/executor.md and docs/adr/005-executor-claim-path.md.
"""

from connector.executor.work.engine import Engine, EngineConfig, engine_config_from_settings

__all__ = ["Engine", "EngineConfig", "engine_config_from_settings"]
