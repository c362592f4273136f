"""Operator actions write one INFO line each with their ids and the actor: a replay (work id), a
bulk replay (counts), a pack apply and a generation activation; never a payload."""

from __future__ import annotations

import logging

import pytest
import yaml

from connector.v1 import admin_service_pb2 as pb

from .conftest import OPERATOR, REPLAY, Admin, Seed, manifest


def _lines(caplog: pytest.LogCaptureFixture, msg: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == msg]


async def test_replay_and_pack_actions_are_logged_with_ids(
    admin: Admin, seed: Seed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pack = await seed.pack()
    work_id = await seed.item(pack, generation=1)
    await admin.stub.ReplayWorkItem(pb.ReplayWorkItemRequest(work_id=work_id), metadata=Admin.md(REPLAY))
    [line] = _lines(caplog, "work item replayed")
    assert line.levelno == logging.INFO and line.work_id == work_id and line.actor  # type: ignore[attr-defined]

    await admin.stub.ReplayDeadLetters(
        pb.ReplayDeadLettersRequest(installed_pack_id=pack), metadata=Admin.md(REPLAY)
    ).read()
    assert len(_lines(caplog, "work item replayed")) == 1  # not one line per item of a bulk replay
    [bulk] = _lines(caplog, "bulk replay finished")
    assert bulk.installed_pack_id == pack and bulk.replayed == 0  # type: ignore[attr-defined]

    doc = yaml.safe_dump(manifest("logged", "logged", None))
    applied = await admin.stub.ApplyPack(pb.ApplyPackRequest(manifest=doc), metadata=Admin.md(OPERATOR))
    [line] = _lines(caplog, "pack applied")
    assert line.pack == "logged" and line.generation == applied.generation  # type: ignore[attr-defined]
    await admin.stub.ActivateGeneration(
        pb.ActivateGenerationRequest(installed_pack_id=applied.pack.installed_pack_id, generation=1),
        metadata=Admin.md(OPERATOR),
    )
    [line] = _lines(caplog, "generation activated")
    assert line.installed_pack_id == applied.pack.installed_pack_id  # type: ignore[attr-defined]
