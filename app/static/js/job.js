// The job page: history from the metrics API, then live from the job's event stream. Charts gain
// points, the schedules are redrawn, and the server-rendered parts (status, bottleneck, plan,
// events, artifacts) are fetched again when what they show may have changed. No page reload.
import { LiveChart } from "./charts.js";
import { mebibytes } from "./format.js";
import { drawGantt, measuredWindow, showEmpty } from "./gantt.js";
import { LatestValues } from "./latest.js";
import { FinetunePanel } from "./finetune.js";
import { LogPanel } from "./logs.js";
import { followJob, getJSON, handleActionButtons, handleCancelButtons, refreshPart, throttle } from "./server.js";
import { JobTelemetry } from "./telemetry.js";

const config = JSON.parse(document.getElementById("job-config").textContent);
const api = `/api/v1/jobs/${config.id}`;
const telemetry = new JobTelemetry(config);
let planned = config.hasPlan; // the plan phase writes it before the ranks start
let predicted = config.predicted; // the planner's simulated schedule, when the job was profiled
let state = config.state;
const ended = () => config.final || state === "ended";

// The job's own time axis: from its start to its end (to now while it runs), whatever part of it the
// ranks' tasks took up (a short distillation after minutes of profiling is a narrow band, not the axis).
function jobTime() {
  if (config.startedAt === null || config.startedAt === undefined) return null;
  const end = config.finishedAt ?? Date.now() / 1000;
  return [0, Math.max(0, end - config.startedAt)];
}

const charts = {
  loss: new LiveChart(document.getElementById("chart-loss"), telemetry.loss, { xLabel: "step", yLabel: "loss" }),
  throughput: new LiveChart(document.getElementById("chart-throughput"), telemetry.rate, {
    xLabel: "s since start", yLabel: "samples/s", xRange: jobTime,
  }),
  util: new LiveChart(document.getElementById("chart-util"), telemetry.util, {
    xLabel: "s since start", yLabel: "busy / GPU util", yRange: [0, 1], format: (v) => `${Math.round(v * 100)}%`,
    xRange: jobTime,
  }),
  memory: new LiveChart(document.getElementById("chart-memory"), telemetry.memory, {
    xLabel: "s since start", yLabel: "memory", format: mebibytes, xRange: jobTime,
  }),
};
// each chart's text equivalent: a collapsed table of the latest values under it
const latest = new LatestValues(
  telemetry,
  Object.fromEntries(Object.keys(charts).map((name) => [name, document.getElementById(`chart-${name}-values`)])),
);
const drawCharts = () => {
  Object.values(charts).forEach((chart) => chart.update());
  latest.update();
};

let logs = null;
const finetune = config.finetune.enabled
  ? new FinetunePanel({
    jobId: config.id, nproc: config.nproc, predicted: config.finetune.predicted, perplexity: config.finetune.perplexity,
  })
  : null;
const part = (name) => refreshPart(document.getElementById(`part-${name}`), `/jobs/${config.id}/partials/${name}`);
async function refreshStatus() {
  await part("status");
  if (document.getElementById("status")?.dataset.runDir === "1") logs?.started();
}
const refresh = {
  status: throttle(refreshStatus, 1000),
  bottleneck: throttle(() => part("bottleneck"), 2000),
  events: throttle(() => part("events"), 3000),
  finetune: throttle(() => (finetune ? part("finetune") : Promise.resolve()), 1000),
  // calibration and re-plans change the plan while distillation runs; a re-plan also its prediction
  plan: throttle(async () => {
    const before = document.getElementById("plan-replans")?.dataset.count;
    await part("plan");
    if (document.getElementById("plan-replans")?.dataset.count !== before) await loadPlan().then(drawSchedules);
  }, 5000),
  // finalize wrote the summary (and a transformer search's architecture.json): the part appears
  outcome: throttle(async () => {
    const section = document.getElementById("part-outcome");
    if (await part("outcome")) section.hidden = section.querySelector("[data-outcome]") === null;
  }, 1000),
  architecture: throttle(async () => {
    const section = document.getElementById("part-architecture");
    if (await part("architecture")) section.hidden = section.querySelector("table") === null;
  }, 5000),
};

function drawSchedules() {
  const segments = predicted?.segments ?? [];
  const box = document.getElementById("gantt-predicted");
  if (segments.length) {
    drawGantt(box, { nproc: config.nproc, segments, t0: 0, t1: Math.max(...segments.map((s) => s.end)) });
  } else if (planned) {
    showEmpty(box, "No prediction: the blocks were not profiled (schedule.profile: false).");
  } else {
    showEmpty(box, ended() ? "No plan: the job ended before a worker planned it." : "The prediction appears with the plan, when a worker starts the job.");
  }
  const measured = document.getElementById("gantt-measured");
  const latest = measuredWindow(telemetry.recent);
  if (latest) drawGantt(measured, { nproc: config.nproc, ...latest });
  else showEmpty(measured, ended() ? "No tasks: the job ended before its ranks reported one." : "Appears once the ranks report their first tasks.");
}
const redrawSchedules = throttle(drawSchedules, 1000);

// A job that starts running while the page is open: its plan (written before the ranks launch).
async function loadPlan() {
  const plan = await getJSON(`${api}/plan`);
  planned = true;
  predicted = plan.simulation?.chosen ?? null;
  telemetry.numBlocks ??= plan.num_blocks;
}

// The downsampled history for the charts; the page itself carries each rank's newest raw lines for
// the measured schedule.
async function loadHistory() {
  for (const record of config.recent) telemetry.keep(record);
  const history = await getJSON(`${api}/metrics?max_points=${config.historyPoints}`); // preloaded by the page
  telemetry.startRate(history.points);
  history.points.sort((a, b) => a.time - b.time); // each rank stays in order; the charts' rows mostly append
  for (const point of history.points) telemetry.add(point);
}

function onState(event) {
  state = event.state;
  refresh.status();
  refresh.events();
  part("artifacts");
}

// A phase started or ended: the timeline in the status, the artifacts it wrote, and once the plan
// phase has succeeded the plan and its predicted schedule.
function onPhase(event) {
  refresh.status();
  refresh.events();
  part("artifacts");
  logs.phaseChanged(event.phase, event.phases?.find((phase) => phase.name === event.phase)?.runs);
  if (event.phases?.some((phase) => phase.name === "finalize" && phase.outcome === "succeeded")) refresh.outcome();
  const succeeded = (name) => event.phases?.some((phase) => phase.name === name && phase.outcome === "succeeded");
  if (!planned && succeeded("plan")) loadPlan().then(() => { part("plan"); drawSchedules(); });
  if (finetune) {
    refresh.finetune();
    if (!finetune.predicted.length && succeeded("plan_finetune")) finetune.loadPlan();
  }
}

function onMetrics(event) {
  if (!event.records?.length) return;
  if (event.phase === "finetune") {
    finetune?.addRecords(event.records);
    refresh.status();
    return;
  }
  telemetry.addRecords(event.records);
  drawCharts();
  redrawSchedules();
  refresh.status();
  refresh.bottleneck();
  if (planned) refresh.plan();
  if (telemetry.hasArchitecture) refresh.architecture();
}

async function onEnd() {
  state = "ended";
  for (const chart of Object.values(charts)) chart.emptyText = "No points: the job ended before its ranks reported any.";
  drawCharts();
  await Promise.all([refreshStatus(), part("bottleneck"), part("events"), part("artifacts"), part("plan"), refresh.finetune(), refresh.outcome()]);
  drawSchedules();
  document.body.dataset.streamEnded = "1";
}

async function start() {
  logs = new LogPanel({
    jobId: config.id,
    select: document.getElementById("log-source"),
    phaseSelect: document.getElementById("log-phase"),
    follow: document.getElementById("log-follow"),
    output: document.getElementById("log-text"),
    available: config.hasLogs,
  });
  document.getElementById("loss-log").addEventListener("change", (event) => charts.loss.setLog(event.target.checked));
  document.getElementById("loss-range").addEventListener("change", (event) => {
    charts.loss.setSource(event.target.checked ? telemetry.rangeTable() : telemetry.loss);
  });
  handleCancelButtons(document.getElementById("part-status"), null, refreshStatus);
  // a resumed job runs again: the page follows its new event stream from the start
  handleActionButtons(document.getElementById("part-status"), null, (_, action) =>
    action === "resume" ? window.location.reload() : refreshStatus(),
  );
  await loadHistory();
  await finetune?.load();
  drawCharts();
  drawSchedules();
  window.addEventListener("resize", redrawSchedules);
  await new Promise((resolve) => requestAnimationFrame(resolve)); // after the charts' own frame: drawn
  document.body.dataset.readyMs = String(Math.round(performance.now()));
  document.body.dataset.ready = "1";
  logs.load();
  followJob(config.id, config.afterEventId, {
    state: onState,
    phase: onPhase,
    metrics: onMetrics,
    log: (event) => logs.grew(event.phase, event.rank),
    end: onEnd,
  });
}

start();
