"""A weight push meets a dead or hung peer (gloo standing in for NCCL on CPU): the trainer's push
ends by its deadline with the communicator aborted and the next push works; a worker stuck in a
push step exits for a restart, and its replacement refuses the old group's replayed steps."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

import torch  # noqa: E402

from core.replica import ReplicaState  # noqa: E402
from rl.model import ModelConfig, init_model, save_pretrained  # noqa: E402
from services.rollout_worker.engine import EngineOutput  # noqa: E402
from services.rollout_worker.worker import EngineWedged, RolloutWorker  # noqa: E402
from services.trainer.torch_backend import GRPOConfig, TorchGRPOTrainer  # noqa: E402
from shared import weight_transfer  # noqa: E402
from shared.bus import Bus  # noqa: E402
from shared.names import Names  # noqa: E402
from shared.runtime import free_port  # noqa: E402
from shared.schema import Command, CommandAck, CommandAction, FinishReason, PushStep, decode  # noqa: E402
from shared.streams import connect  # noqa: E402
from shared.weight_transfer import TARGET_KEY, PushAborted  # noqa: E402
from tests.gloo_peer import PeerClient  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

DEADLINE_S = 4.0
TINY = ModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=1,
                   num_key_value_heads=1)


def _trainer(tmp_path: Path, transfer_port: int = 0) -> TorchGRPOTrainer:
    save_pretrained(init_model(TINY, seed=0), tmp_path / "model")
    return TorchGRPOTrainer(GRPOConfig(model_path=str(tmp_path / "model"), weights_root=str(tmp_path / "w"),
                                       checkpoint_dir=str(tmp_path / "c"), device="cpu",
                                       push_timeout_s=DEADLINE_S, transfer_port=transfer_port))


def _groups(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record each communicator the trainer forms."""
    formed: list[Any] = []
    real = weight_transfer.trainer_engine

    def recording(*args: Any, **kwargs: Any) -> Any:
        engine = real(*args, **kwargs)
        formed.append(engine.model_update_group)
        return engine

    monkeypatch.setattr(weight_transfer, "trainer_engine", recording)
    return formed


def _push_in_background(trainer: TorchGRPOTrainer, client: PeerClient) -> Any:
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(trainer.push_weights, "gloo", client)
    pool.shutdown(wait=False)
    return future


def _assert_received_everything(trainer: TorchGRPOTrainer, client: PeerClient) -> None:
    params = {k: p.detach().numpy().tobytes() for k, p in trainer.model.named_parameters()}
    assert client.received == params


def test_a_peer_killed_mid_broadcast_fails_the_push_at_once_and_the_next_push_works(tmp_path, monkeypatch):
    """On a fixed rendezvous port (rollout.weight_transfer_port): the new group binds it again."""
    port = free_port()
    trainer = _trainer(tmp_path, transfer_port=port)
    formed = _groups(monkeypatch)
    peer = PeerClient(incarnation="first")
    try:
        push = _push_in_background(trainer, peer)
        assert peer.midway.wait(120)
        peer.process.kill()
        started = time.monotonic()
        with pytest.raises((PushAborted, RuntimeError)):
            push.result(timeout=DEADLINE_S + 10)
        assert time.monotonic() - started < DEADLINE_S + 5
        assert formed[0]._aborted.is_set()  # torn down: the next push forms a new group
    finally:
        peer.close()
    restarted = PeerClient(incarnation="second")
    try:
        with torch.no_grad():
            trainer.model.lm_head.weight.add_(1.0)
        trainer.push_weights("gloo", restarted)
        _assert_received_everything(trainer, restarted)
        assert len(formed) == 2 and restarted.joined_port == port
    finally:
        restarted.close()


def test_a_push_to_a_hung_peer_ends_by_its_deadline_with_the_communicator_aborted(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path)
    formed = _groups(monkeypatch)
    peer = PeerClient(incarnation="hung", stall=True)
    try:
        push = _push_in_background(trainer, peer)
        assert peer.midway.wait(120)
        started = time.monotonic()
        with pytest.raises(PushAborted, match="deadline"):
            push.result(timeout=DEADLINE_S + 30)
        assert time.monotonic() - started < DEADLINE_S + 5
        assert formed[0]._aborted.is_set()
        assert not trainer._push_groups
    finally:
        peer.close()


class _StuckEngine:
    """An engine whose push `update` never returns (the trainer died mid-broadcast)."""

    def __init__(self) -> None:
        self.steps: list[PushStep] = []

    async def transfer(self, step: PushStep, info: dict[str, Any], *, version: int) -> None:
        self.steps.append(step)
        if step is PushStep.UPDATE:
            await asyncio.sleep(3600)

    async def abort_all(self) -> None:
        raise AssertionError("a wedged engine must not be called again")

    async def generate(self, **_: Any) -> EngineOutput:
        return EngineOutput(token_ids=[], logprobs=[], finish_reason=FinishReason.ABORT)

    async def resume(self) -> None: ...
    async def sleep(self) -> None: ...
    async def wake(self) -> None: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def load_weights(self, *, version: int, path: str | None) -> None: ...


class _FreshEngine(_StuckEngine):
    async def abort_all(self) -> None: ...


async def _ack(bus: Bus, command_id: str) -> Any:
    async with asyncio.timeout(20):
        while True:
            for _, fields in await bus.redis.xrange(bus.names.controller_acks):
                ack = decode(fields)
                if isinstance(ack, CommandAck) and ack.command_id == command_id:
                    return ack
            await asyncio.sleep(0.05)


async def test_a_worker_stuck_in_a_push_exits_and_its_replacement_refuses_the_old_groups_steps(redis_server):
    bus = Bus(connect(redis_server.url), Names("test"))
    engine = _StuckEngine()
    worker = RolloutWorker(bus=bus, replica_id="standalone_0", engine=engine,
                           initial_state=ReplicaState.PAUSED, incarnation="old", push_timeout_s=1.0)
    stream = bus.names.worker_commands("standalone_0")
    try:
        await bus.publish(stream, Command(command_id="u1", action=CommandAction.WEIGHTS_UPDATE, version=2,
                                          data={TARGET_KEY: "old", "names": []}))
        with pytest.raises(EngineWedged, match="still running after 1s"):
            async with asyncio.timeout(30):
                await worker.run(asyncio.Event())
        assert worker.wedged and engine.steps == [PushStep.UPDATE]
        assert await bus.redis.get(bus.names.worker_heartbeat("standalone_0")) is None
        fresh = RolloutWorker(bus=bus, replica_id="standalone_0", engine=_FreshEngine(),
                              initial_state=ReplicaState.PAUSED, incarnation="new")
        stop = asyncio.Event()
        running = asyncio.create_task(fresh.run(stop))
        ack = await _ack(bus, "u1")  # the unacked command is replayed to the new process
        stop.set()
        await asyncio.wait_for(running, 10)
        assert not ack.ok and "is for worker old, this is new" in ack.error
        assert fresh.engine.steps == []
    finally:
        await bus.redis.aclose()


class _CachedGroup:
    """A cached trainer engine as `close_group` sees it."""

    def __init__(self) -> None:
        self.model_update_group = None
        self.closed = False

    def shutdown(self) -> None:
        self.closed = True


def test_forming_a_push_group_closes_the_cached_groups_its_replicas_were_in(tmp_path):
    # vLLM's engine holds one transfer group: a replica that joins a new group no longer listens on its
    # old one, so a cached group with it must be formed anew, not broadcast to
    trainer = _trainer(tmp_path)
    pair, alone, other = _CachedGroup(), _CachedGroup(), _CachedGroup()
    trainer._push_groups = {("gloo", ("standalone_0", "standalone_1")): (("a", "b"), pair),
                            ("gloo", ("hybrid_0",)): (("c",), other)}
    trainer._close_overlapping_groups(("gloo", ("standalone_0",)))
    assert pair.closed and not other.closed
    assert list(trainer._push_groups) == [("gloo", ("hybrid_0",))]
    trainer._push_groups[("gloo", ("standalone_0",))] = (("a",), alone)
    trainer._close_overlapping_groups(("gloo", ("hybrid_0",)))
    assert not alone.closed and other.closed
