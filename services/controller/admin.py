"""The controller's admin API (FastAPI) and Prometheus export.

Where it sits: served by uvicorn inside the controller process, on the same
event loop as the controller, so handlers read and steer the live
`Controller` without locks. Forced switches are queued in the core and
applied at the next safe point with the normal ordering.

Endpoints: GET /healthz (liveness: every loop made progress within run.loop_stale_s and
Redis answers, else 503), GET /readyz (connected and the controller holds its state, else
503), GET /status, POST /activate, POST /deactivate, GET /policy, PUT /policy, GET /metrics
(Prometheus text), and the live dashboard (GET /dashboard and its JSON, dashboard.py).
admin_guard.py stands in front: the bearer token, and bodies capped at 64 KB (413).
Bad requests get a 4xx with a message that says what was wrong (422 for a value of the
wrong type, NaN or an infinity, never echoing the value back); a switch asked for after the
run finished gets 409. A policy chosen with PUT /policy is kept in Redis, so a restarted
controller goes on with it.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from core.controller import Mode
from policies import build_policy, registered_policies
from services.controller.admin_guard import AdminGuard
from services.controller.dashboard import add_dashboard
from services.controller.service import Controller
from shared.bus import text
from shared.health import redis_reachable
from shared.liveness import LIVENESS, stale_loops
from shared.names import TRAINER_GROUP, RunStateField, RunStatus, TrainerStateField
from shared.streams import group_lag


class PolicyUpdate(BaseModel):
    """Strict: `true` or "0.5" is not a ratio, and NaN / infinities (1e309) are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    name: str | None = Field(default=None, description="a registered policy name")
    deactivate_ratio: float | None = Field(default=None, ge=0.0, le=1.0)


class PrometheusExporter:
    """One gauge per metric name (the seed's names with every non-alphanumeric char replaced by '_')."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}

    def update(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
            if name not in self._gauges:
                self._gauges[name] = Gauge(name, f"dynsched metric {key}", registry=self.registry)
            self._gauges[name].set(value)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def build_app(controller: Controller, exporter: PrometheusExporter, *, token: str = "",
              loopback: bool = True) -> FastAPI:
    """The admin app; `token` '' = none configured (then only reads, and only on loopback)."""
    app = FastAPI(title="dynsched controller", version="0.1.0")
    app.add_middleware(AdminGuard, token=token, loopback=loopback)
    bus = controller.bus
    controller.on_metrics.append(exporter.update)

    _add_probes_and_errors(app, controller)

    @app.get("/status")
    async def status() -> dict[str, Any]:
        return await status_view(controller)

    @app.post("/activate", status_code=202)
    async def activate() -> dict[str, Any]:
        return await _force(activate=True)

    @app.post("/deactivate", status_code=202)
    async def deactivate() -> dict[str, Any]:
        return await _force(activate=False)

    async def _force(*, activate: bool) -> dict[str, Any]:
        if await run_status(controller) == RunStatus.DONE:
            raise HTTPException(409, "the run has finished: there is no next safe point to switch at")
        if not controller.core.hybrid_ids:
            raise HTTPException(409, "no hybrid replicas are configured: enable "
                                     "async_training.use_dynamic_resource_scheduling to have hybrids")
        await controller.force(activate=activate)
        when = "the next weight sync" if activate else "the start of the next trainer micro-step"
        return {"pending_force": "activate" if activate else "deactivate", "applied_at": when,
                "mode": controller.core.mode.value}

    @app.get("/policy")
    async def get_policy() -> dict[str, Any]:
        return {**controller.core.policy.describe(), "registered": registered_policies()}

    @app.put("/policy")
    async def put_policy(update: PolicyUpdate) -> dict[str, Any]:
        try:
            apply_policy_update(controller, update)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc
        if update.name is not None:  # kept over the config's by a restarted controller (service.py)
            await bus.redis.set(bus.names.controller_policy, controller.core.policy.policy_name)
        await controller.persist()
        return controller.core.policy.describe()

    @app.get("/metrics")
    async def metrics() -> Response:
        core = controller.core
        exporter.update({"dynsched_controller_activations_total": float(core.activations),
                         "dynsched_controller_deactivations_total": float(core.deactivations),
                         "dynsched_controller_hybrid_active": float(core.mode is Mode.HYBRID_ACTIVE),
                         "dynamic_resource/queue_size_now": float(
                             await group_lag(bus.redis, bus.names.mq, TRAINER_GROUP))})
        return Response(exporter.render(), media_type=CONTENT_TYPE_LATEST)

    add_dashboard(app, controller)
    return app


def _add_probes_and_errors(app: FastAPI, controller: Controller) -> None:
    """/healthz, /readyz, and a 422 that never echoes the input back."""
    bus = controller.bus

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's default echoes the input (NaN cannot be encoded: a 500; a huge body comes back)."""
        return JSONResponse(status_code=422, content={"detail": [
            {"loc": [str(part) for part in error.get("loc", ())], "msg": str(error.get("msg", "")),
             "type": str(error.get("type", ""))} for error in exc.errors()]})

    @app.get("/healthz")
    async def healthz(response: Response) -> dict[str, Any]:
        ages = LIVENESS.ages()
        stale = stale_loops(ages, controller.config.run.loop_stale_s)
        redis_ok = await redis_reachable(bus.redis)
        ok = redis_ok and not stale
        response.status_code = 200 if ok else 503
        return {"ok": ok, "redis": redis_ok, "loops": ages, "stale": stale}

    @app.get("/readyz")
    async def readyz(response: Response) -> dict[str, Any]:
        redis_ok = await redis_reachable(bus.redis)
        has_state = redis_ok and controller.ready and bool(await bus.redis.exists(bus.names.controller_state))
        response.status_code = 200 if has_state else 503
        return {"ready": has_state, "redis": redis_ok, "state_restored": controller.ready}


def pending_force_name(pending: bool | None) -> str | None:
    """The core keeps a forced switch as True (activate) / False (deactivate) / None; the API says it
    in words, the same in /status as in the POST /activate and /deactivate replies."""
    return None if pending is None else ("activate" if pending else "deactivate")


async def run_status(controller: Controller) -> str:
    """`run_state.status`: running, done or failed ('' before a launcher set it)."""
    return text(await controller.bus.redis.hget(controller.bus.names.run_state, RunStateField.STATUS) or b"")


async def status_view(controller: Controller) -> dict[str, Any]:
    bus = controller.bus
    names = bus.names
    replicas = {text(k): text(v) for k, v in (await bus.redis.hgetall(names.replica_states)).items()}
    trainer = {text(k): text(v) for k, v in (await bus.redis.hgetall(names.trainer_state)).items()}
    accounting = {text(k): int(v) for k, v in (await bus.redis.hgetall(names.accounting)).items()}
    status = await run_status(controller)
    return {
        **controller.core.describe(),
        "pending_force": pending_force_name(controller.core.pending_force),
        "run_status": status or RunStatus.RUNNING,
        "finished": status == RunStatus.DONE,
        "replicas": {rid: {"state": v.split(":")[0], "version": int(v.split(":")[1])}
                     for rid, v in sorted(replicas.items())},
        "lb_members": [text(m) for m in await bus.redis.lrange(names.lb_members, 0, -1)],
        "queue_size": await group_lag(bus.redis, names.mq, TRAINER_GROUP),
        "trainer": {"global_steps": int(trainer.get(TrainerStateField.GLOBAL_STEPS, 1)),
                    "version": int(trainer.get(TrainerStateField.VERSION, 0))},
        "accounting": accounting,
        "last_metrics": controller.last_metrics,
    }


def apply_policy_update(controller: Controller, update: PolicyUpdate) -> None:
    """Switch policy (fresh state) and/or set its ratio; ValueError on an unknown name or bad ratio."""
    core = controller.core
    if update.name is not None and update.name != core.policy.policy_name:
        if update.name not in registered_policies():
            raise ValueError(f"unknown policy {update.name!r}; registered: {registered_policies()}")
        ratio = update.deactivate_ratio
        if ratio is None:
            ratio = float(getattr(core.policy, "deactivate_ratio", 0.3))
        core.policy = build_policy(update.name, deactivate_ratio=ratio, only_hybrid=core.ctx.only_hybrid)
    elif update.deactivate_ratio is not None:
        core.policy.set_deactivate_ratio(update.deactivate_ratio)
