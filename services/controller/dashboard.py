"""The live dashboard: one page (static/dashboard.html + dashboard.js, no dependency) and the JSON it polls.

Where it sits: mounted on the admin app (admin.py) in the controller process. The page polls
`GET /status` (mode, policy, versions), `GET /api/timeline` (the resource-time chart of the last
minutes, rebuilt from the audit stream by core.timeline, the same code as resource_time.png) and
`GET /api/series` (mq_size sampled every second by this process, and the per-cycle metrics from
the metrics stream); its buttons call POST /activate, POST /deactivate and PUT /policy.
Times in the JSON are seconds relative to `now` (negative = in the past), so no clock is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Response

from core.timeline import TRAINER, Interval, timeline
from services.controller.service import Controller
from shared import schema
from shared.names import TRAINER_GROUP
from shared.streams import group_lag, raise_if_cancel_swallowed

STATIC_DIR = Path(__file__).with_name("static")
STATIC_FILES = {"dashboard.html": "text/html; charset=utf-8",
                "dashboard.js": "text/javascript; charset=utf-8"}
MAX_WINDOW_S = 3600.0
MAX_AUDIT_EVENTS = 20_000
MAX_CYCLES = 500
SAMPLE_INTERVAL_S = 1.0
SERIES_KEYS = ("dynamic_resource/mq_size", "dynamic_resource/resource_utilization",
               "dynamic_resource/rollout_resource_utilization", "dynamic_resource/train_resource_utilization",
               "training/reward_mean", "dynamic_resource/activations", "dynamic_resource/deactivations")


class MqSampler:
    """mq_size over time (one sample a second at most, the last hour), kept in this process's memory."""

    def __init__(self, controller: Controller, *, max_samples: int = int(MAX_WINDOW_S / SAMPLE_INTERVAL_S)
                 ) -> None:
        self.controller = controller
        self.samples: deque[tuple[float, int]] = deque(maxlen=max_samples)

    async def sample(self) -> None:
        now = time.time()
        if self.samples and now - self.samples[-1][0] < SAMPLE_INTERVAL_S / 2:
            return
        bus = self.controller.bus
        self.samples.append((now, await group_lag(bus.redis, bus.names.mq, TRAINER_GROUP)))

    async def run(self) -> None:
        """Sample until cancelled (the app's lifespan); a Redis hiccup skips one sample."""
        while True:
            with contextlib.suppress(Exception):
                await self.sample()
            raise_if_cancel_swallowed()  # a cancel redis-py swallowed (redis/redis-py#2028) ends it too
            await asyncio.sleep(SAMPLE_INTERVAL_S)


@contextlib.asynccontextmanager
async def sampling(sampler: MqSampler) -> AsyncIterator[None]:
    task = asyncio.create_task(sampler.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def recent_events(controller: Controller, stream: str, count: int) -> list[Any]:
    """The newest `count` entries of `stream`, decoded, oldest first (malformed ones skipped)."""
    entries: Any = await controller.bus.redis.xrevrange(stream, max="+", min="-", count=count)
    messages = []
    for _, fields in reversed(entries):
        with contextlib.suppress(schema.MalformedMessage):
            messages.append(schema.decode(fields))
    return messages


def clip_rows(rows: dict[str, list[Interval]], *, offset_s: float,
              window_s: float) -> dict[str, list[list[Any]]]:
    """Intervals shifted by `offset_s` (to seconds relative to now) and clipped to [-window_s, 0]."""
    clipped: dict[str, list[list[Any]]] = {}
    for row, intervals in rows.items():
        kept = [[round(max(a + offset_s, -window_s), 3), round(min(b + offset_s, 0.0), 3), category]
                for a, b, category in intervals if b + offset_s > -window_s and a + offset_s < 0.0]
        clipped[row] = sorted(kept)
    return clipped


def row_order(rows: dict[str, Any]) -> list[str]:
    replicas = sorted(rows)
    standalones = [r for r in replicas if r.startswith("standalone")]
    return standalones + [r for r in replicas if r.startswith("hybrid")] + [TRAINER]


def add_dashboard(app: FastAPI, controller: Controller) -> None:
    sampler = MqSampler(controller)
    app.router.lifespan_context = lambda _app: sampling(sampler)

    @app.get("/dashboard")
    async def dashboard() -> Response:
        return await static_file("dashboard.html")

    @app.get("/dashboard/{name}")
    async def static_file(name: str) -> Response:
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no dashboard file {name!r}")
        return Response((STATIC_DIR / name).read_bytes(), media_type=STATIC_FILES[name],
                        headers={"Cache-Control": "no-cache"})

    @app.get("/api/timeline")
    async def api_timeline(window_s: float = Query(300.0, gt=0, le=MAX_WINDOW_S)) -> dict[str, Any]:
        """Per row (replica ids, trainer): [start_s, end_s, category], in seconds relative to now."""
        now = time.time()
        events = [m for m in await recent_events(controller, controller.bus.names.audit, MAX_AUDIT_EVENTS)
                  if isinstance(m, schema.AuditEvent)]
        if not events:
            return {"now": now, "window_s": window_s, "age_s": 0.0, "order": [], "rows": {}}
        rows = timeline(events, until=now)  # open intervals end now
        offset_s = events[0].t - now
        return {"now": now, "window_s": window_s, "age_s": round(-offset_s, 3), "order": row_order(rows),
                "rows": clip_rows(rows, offset_s=offset_s, window_s=window_s)}

    @app.get("/api/series")
    async def api_series(window_s: float = Query(300.0, gt=0, le=MAX_WINDOW_S)) -> dict[str, Any]:
        """mq_size samples [t_s, size] and per-cycle metrics (t_s, version, SERIES_KEYS), relative to now."""
        await sampler.sample()
        now = time.time()
        cycles = [{"t": round(m.t - now, 3), "version": m.version,
                   **{key: m.metrics[key] for key in SERIES_KEYS if key in m.metrics}}
                  for m in await recent_events(controller, controller.bus.names.metrics, MAX_CYCLES)
                  if isinstance(m, schema.CycleMetrics) and m.t - now > -window_s]
        mq = [[round(t - now, 3), size] for t, size in sampler.samples if t - now > -window_s]
        return {"now": now, "window_s": window_s, "mq": mq, "cycles": cycles}
