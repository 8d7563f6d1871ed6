// dynsched live dashboard: polls the controller's admin API every POLL_MS and redraws three canvases.
// JSON: GET /status, GET /api/timeline, GET /api/series (times in seconds relative to now, <= 0).
// Every request carries the admin token (Authorization: Bearer), taken from the page's token field
// or the URL fragment `#token=...`, kept for this tab only (sessionStorage).
"use strict";

const POLL_MS = 2000;
const WINDOW_S = 300;
const COLORS = {rollout: "#4c72b0", train: "#e6b422", sync: "#55a868", switch: "#c44e52", idle: "#dddddd"};
const LABELS = {rollout: "serving (rollout)", train: "training", sync: "weight sync",
                switch: "switching (awake, not serving)", idle: "sleeping / idle"};
const UTIL_SERIES = [["dynamic_resource/resource_utilization", "cluster", "#333333"],
                     ["dynamic_resource/rollout_resource_utilization", "rollout", "#4c72b0"],
                     ["dynamic_resource/train_resource_utilization", "train", "#e6b422"]];
const $ = (id) => document.getElementById(id);
let policyLoaded = false;

const TOKEN_KEY = "dynsched-admin-token";

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY) || "";
  return token ? {Authorization: `Bearer ${token}`} : {};
}

function takeTokenFromFragment() {
  const match = /(?:^|&)token=([^&]*)/.exec(window.location.hash.slice(1));
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", window.location.pathname);  // not left in the address bar
  }
}

async function getJson(path) {
  const response = await fetch(path, {cache: "no-store", headers: authHeaders()});
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

function say(text, isError) {
  const message = $("message");
  message.textContent = text;
  message.className = isError ? "error" : "";
}

async function send(method, path, body) {
  const init = {method, headers: {"Content-Type": "application/json", ...authHeaders()}};
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail || data);
    say(`${method} ${path}: HTTP ${response.status}: ${detail}`, true);
    return null;
  }
  return data;
}

function renderStatus(status) {
  $("mode").textContent = status.mode;
  const policy = status.policy || {};
  const ratio = policy.deactivate_ratio === undefined ? ""
    : ` (ratio ${Number(policy.deactivate_ratio).toFixed(2)})`;
  $("policy").textContent = `${policy.name || "?"}${ratio}`;
  $("versions").textContent = `v${status.trainer.version} / step ${status.trainer.global_steps}`;
  const versions = Object.entries(status.replicas || {}).map(([id, r]) => `${id.replace("standalone_", "s")
    .replace("hybrid_", "h")}:v${r.version}`);
  $("replica-versions").textContent = versions.join(" ") || "-";
  $("mq-now").textContent = status.queue_size;
  $("switches").textContent = `${status.activations} / ${status.deactivations}`;
  $("pending").textContent = status.pending_force || "none";
  const a = status.accounting || {};
  const lost = (a.fed || 0) - (a.generating || 0) - (a.queued || 0) - (a.trained || 0) - (a.dropped || 0);
  $("samples").textContent = `${a.fed || 0} / ${a.trained || 0} / ${lost}`;
  $("finished").textContent = status.finished ? "run finished" : "";
  for (const id of ["activate", "deactivate"]) $(id).disabled = Boolean(status.finished);
  if (!policyLoaded) loadPolicy(policy);
}

async function loadPolicy(policy) {
  const info = await getJson("/policy");
  const select = $("policy-name");
  select.replaceChildren(...info.registered.map((name) => new Option(name, name, false, name === info.name)));
  $("policy-ratio").value = policy.deactivate_ratio ?? info.deactivate_ratio ?? "";
  policyLoaded = true;
}

// The charts show the last WINDOW_S seconds, or the whole run while it is younger (at least a minute).
function shownWindow(ageS) {
  return Math.min(WINDOW_S, Math.max(60, Math.ceil(ageS / 30) * 30));
}

function tickLabel(s) {
  if (s === 0) return "now";
  return s % 60 === 0 ? `-${s / 60} min` : `-${s} s`;
}

function axes(ctx, canvas, left, windowS) {
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = "#666";
  ctx.font = "11px system-ui, sans-serif";
  const width = canvas.width - left - 20;
  const stepS = windowS > 180 ? 60 : windowS > 60 ? 30 : 10;
  for (let s = 0; s <= windowS; s += stepS) {
    const x = left + width * (1 - s / windowS);
    ctx.fillText(tickLabel(s), x - 14, canvas.height - 4);
    ctx.fillStyle = "#eee";
    ctx.fillRect(x, 0, 1, canvas.height - 16);
    ctx.fillStyle = "#666";
  }
  return (t) => left + width * (1 + t / windowS);
}

function renderTimeline(data, windowS) {
  const canvas = $("timeline");
  const order = data.order || [];
  canvas.height = Math.max(60, 26 * order.length + 24);
  const ctx = canvas.getContext("2d");
  const x = axes(ctx, canvas, 110, windowS);
  $("window-label").textContent = windowS >= 120 ? `${windowS / 60} minutes` : `${windowS} seconds`;
  order.forEach((row, i) => {
    const y = 4 + 26 * i;
    ctx.fillStyle = "#222";
    ctx.fillText(row, 4, y + 15);
    const drawOrder = ["idle", "rollout", "switch", "sync", "train"];  // short bars on top
    for (const category of drawOrder) {
      ctx.fillStyle = COLORS[category];
      for (const [a, b, c] of data.rows[row] || []) {
        if (c === category) ctx.fillRect(x(a), y, Math.max(1, x(b) - x(a)), 20);
      }
    }
  });
}

function line(ctx, x, y, points, color) {
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
  ctx.stroke();
}

function renderSeries(data, windowS) {
  const mqCanvas = $("mq");
  const mqCtx = mqCanvas.getContext("2d");
  const xm = axes(mqCtx, mqCanvas, 50, windowS);
  const cycleMq = data.cycles.filter((c) => "dynamic_resource/mq_size" in c)
    .map((c) => [c.t, c["dynamic_resource/mq_size"]]);
  const top = Math.max(1, ...data.mq.map((p) => p[1]), ...cycleMq.map((p) => p[1]));
  const ym = (v) => mqCanvas.height - 20 - (mqCanvas.height - 30) * v / top;
  mqCtx.fillText(String(top), 4, 14);
  mqCtx.fillText("0", 4, mqCanvas.height - 20);
  line(mqCtx, xm, ym, data.mq, "#4c72b0");
  mqCtx.fillStyle = "#c44e52";
  for (const [t, v] of cycleMq) mqCtx.fillRect(xm(t) - 3, ym(v) - 3, 6, 6);
  mqCtx.fillText("■ per cycle", mqCanvas.width - 90, 14);
  mqCtx.fillStyle = "#4c72b0";
  mqCtx.fillText("— sampled", mqCanvas.width - 160, 14);

  const utilCanvas = $("util");
  const utilCtx = utilCanvas.getContext("2d");
  const xu = axes(utilCtx, utilCanvas, 50, windowS);
  const yu = (v) => utilCanvas.height - 20 - (utilCanvas.height - 30) * v;
  utilCtx.fillText("1.0", 4, 14);
  utilCtx.fillText("0", 4, utilCanvas.height - 20);
  UTIL_SERIES.forEach(([key, label, color], i) => {
    line(utilCtx, xu, yu, data.cycles.filter((c) => key in c).map((c) => [c.t, c[key]]), color);
    utilCtx.fillStyle = color;
    utilCtx.fillText(label, utilCanvas.width - 200 + 60 * i, 14);
  });
}

async function refresh() {
  try {
    const [status, timeline, series] = await Promise.all([
      getJson("/status"), getJson(`/api/timeline?window_s=${WINDOW_S}`),
      getJson(`/api/series?window_s=${WINDOW_S}`)]);
    renderStatus(status);
    const windowS = shownWindow(timeline.age_s || 0);
    renderTimeline(timeline, windowS);
    renderSeries(series, windowS);
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (error) {
    say(`cannot reach the controller: ${error.message}`, true);
  }
}

function setup() {
  takeTokenFromFragment();
  $("admin-token").value = sessionStorage.getItem(TOKEN_KEY) || "";
  $("admin-token").addEventListener("change", () => {
    sessionStorage.setItem(TOKEN_KEY, $("admin-token").value.trim());
    refresh();
  });
  $("legend").replaceChildren(...Object.entries(COLORS).map(([key, color]) => {
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${color}"></i>${LABELS[key]}`;
    return item;
  }));
  for (const action of ["activate", "deactivate"]) {
    $(action).addEventListener("click", async () => {
      const reply = await send("POST", `/${action}`);
      if (reply) say(`${action} requested: applied at ${reply.applied_at}`, false);
      refresh();
    });
  }
  $("policy-apply").addEventListener("click", async () => {
    const ratio = $("policy-ratio").value;
    const body = {name: $("policy-name").value};
    if (ratio !== "") body.deactivate_ratio = Number(ratio);
    const reply = await send("PUT", "/policy", body);
    if (reply) say(`policy is now ${reply.name} (ratio ${reply.deactivate_ratio})`, false);
    refresh();
  });
  refresh();
  setInterval(refresh, POLL_MS);
}

setup();
