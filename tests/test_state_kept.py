"""The launcher's check that Redis still holds a run's state (services/state_kept.py), on a real Redis:
the start it wrote, and a state for every sample the accounting counts as fed."""

from __future__ import annotations

from services.state_kept import lost_state_reason
from shared.names import AccountingField, Names, RunStateField, SampleState
from shared.redis_client import connect_sync

NAMES = Names("kept")
RUN_ID = "1.5"


def test_a_whole_run_state_has_no_reason_to_stop_and_each_loss_names_what_is_gone(redis_server):
    client = connect_sync(redis_server.url)
    try:
        client.hset(NAMES.sample_states, mapping={"a": SampleState.QUEUED, "b": SampleState.TRAINED})
        client.hset(NAMES.accounting, AccountingField.FED, 2)
        run_state = {RunStateField.STARTED_AT: RUN_ID}

        def reason(state: dict[str, str] = run_state) -> str | None:
            return lost_state_reason(client, NAMES, run_id=RUN_ID, run_state=state, micro_steps=3)

        assert reason() is None
        assert "run_state.started_at is gone" in (reason({}) or "")
        client.hdel(NAMES.sample_states, "b")
        assert "holds 1 sample state(s), kept:accounting counts 2 fed" in (reason() or "")
        client.delete(NAMES.accounting)
        assert "holds 1 sample state(s), kept:accounting counts 0 fed" in (reason() or "")
    finally:
        client.close()
