// The compare page: each job's curves overlaid (mean block loss by step, samples/s by seconds since
// its start), live for unfinished jobs through their event streams; the table is re-fetched as
// their metrics arrive.
import { LiveChart } from "./charts.js";
import { AlignedTable, RateWindows } from "./series.js";
import { followJob, getJSON, refreshPart, throttle } from "./server.js";
import { pointFromRecord } from "./telemetry.js";

const jobs = JSON.parse(document.getElementById("compare-config").textContent);
const HISTORY_POINTS = 300;
const loss = new AlignedTable();
const rate = new RateWindows(1);
const lastSeq = new Map(); // "job:rank" -> seq drawn last
const origin = new Map(); // job id -> time of its start

const label = (job) => `#${job.id} ${job.mode}`;
const charts = [
  new LiveChart(document.getElementById("chart-compare-loss"), loss, { xLabel: "step", yLabel: "mean block loss" }),
  new LiveChart(document.getElementById("chart-compare-throughput"), rate, { xLabel: "s since start", yLabel: "samples/s" }),
];
const draw = () => charts.forEach((chart) => chart.update());
const ids = jobs.map((job) => job.id).join(",");
const refreshTable = throttle(() => refreshPart(document.getElementById("compare-table"), `/compare/partials/table?ids=${ids}`), 2000);

function add(job, point) {
  const key = `${job.id}:${point.rank}`;
  if (point.seq <= (lastSeq.get(key) ?? -1)) return;
  lastSeq.set(key, point.seq);
  const taskSeconds = Object.values(point.phases ?? {}).reduce((a, b) => a + b, 0);
  if (!origin.has(job.id)) origin.set(job.id, job.startedAt ?? point.time - taskSeconds);
  if (point.round !== "arch") {
    for (const value of Object.values(point.loss ?? {})) loss.add(point.step, label(job), value);
  }
  const blocks = job.numBlocks || Math.max(1, ...Object.keys(point.loss ?? {}).map((b) => Number(b) + 1));
  const distilled = ((point.samples ?? 0) * (point.count ?? 1) * (point.blocks?.length ?? 1)) / blocks;
  rate.add(label(job), point.time - origin.get(job.id), distilled);
}

async function start() {
  const histories = await Promise.all(jobs.map((job) => getJSON(`/api/v1/jobs/${job.id}/metrics?max_points=${HISTORY_POINTS}`)));
  const spans = histories.map(({ points }) => {
    const times = points.map((p) => p.time);
    return times.length > 1 ? Math.max(...times) - Math.min(...times) : 0;
  });
  rate.width = Math.max(0.5, Math.max(...spans) / 150);
  for (const job of jobs) {
    loss.column(label(job)); // every job in the legend, even one without telemetry yet
    rate.column(label(job));
  }
  jobs.forEach((job, index) => histories[index].points.forEach((point) => add(job, point)));
  draw();
  document.getElementById("compare-log").addEventListener("change", (event) => charts[0].setLog(event.target.checked));
  for (const job of jobs.filter((item) => !item.final)) {
    followJob(job.id, job.afterEventId, {
      metrics: (event) => {
        (event.records ?? []).forEach((record) => add(job, pointFromRecord(record)));
        draw();
        refreshTable();
      },
      state: refreshTable,
      end: refreshTable,
    });
  }
  document.body.dataset.ready = "1";
}

start();
