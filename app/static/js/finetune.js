// The job page's end-to-end training: its loss and accuracy curves (train, and top-1 at each evaluation;
// a language model's held-out perplexity at each evaluation instead) and its micro-batch schedule, predicted by the planner next to each rank's latest measured step. History
// comes from the metrics API (`phase=finetune`), then every `metrics` event of the finetune phase.
import { LiveChart } from "./charts.js";
import { drawGantt, showEmpty } from "./gantt.js";
import { getJSON } from "./server.js";
import { AlignedTable } from "./series.js";

// A telemetry line's timeline (kind, micro-batch, start, end; seconds from its step's start) as Gantt
// segments of `rank`.
export function timelineSegments(record) {
  return (record.timeline ?? []).map(([kind, microbatch, start, end]) => ({
    rank: record.rank, kind, block: microbatch, step: record.step, start, end,
  }));
}

export class FinetunePanel {
  constructor({ jobId, nproc, predicted, perplexity }) {
    this.api = `/api/v1/jobs/${jobId}`;
    this.nproc = nproc;
    this.perplexity = Boolean(perplexity);
    this.predicted = predicted ?? [];
    this.loss = new AlignedTable();
    this.accuracy = new AlignedTable();
    this.lastSeq = new Map();
    this.latest = new Map(); // rank -> its newest line with a timeline
    this.charts = {
      loss: new LiveChart(document.getElementById("chart-ft-loss"), this.loss, { xLabel: "step", yLabel: "loss" }),
      accuracy: new LiveChart(document.getElementById("chart-ft-acc"), this.accuracy, this.perplexity
        ? { xLabel: "step", yLabel: "perplexity", format: (v) => v.toFixed(2) }
        : { xLabel: "step", yLabel: "accuracy", yRange: [0, 1], format: (v) => `${Math.round(v * 100)}%` }),
    };
  }

  async load() {
    const history = await getJSON(`${this.api}/metrics?phase=finetune&max_points=500`);
    for (const point of history.points) this.addPoint(point);
    for (const evaluation of history.evals) this.addEvaluation(evaluation);
    this.draw();
  }

  // A plan written since the page loaded: its predicted schedule.
  async loadPlan() {
    const plan = await getJSON(`${this.api}/artifacts/finetune_plan.json`);
    this.predicted = plan.simulation ?? [];
    this.drawSchedules();
  }

  addPoint(point) {
    if (point.seq !== undefined && point.seq <= (this.lastSeq.get(point.rank) ?? 0)) return;
    this.lastSeq.set(point.rank, point.seq ?? 0);
    const loss = point.loss?.network;
    if (loss !== undefined && loss !== null) this.loss.add(point.step, "train loss", loss);
    const accuracy = !this.perplexity && point.acc !== undefined && point.acc !== null; // a batch's top-1
    if (accuracy) this.accuracy.add(point.step, "train batch", point.acc);
  }

  addEvaluation(evaluation) {
    if (this.perplexity) {
      if (evaluation.perplexity !== null && evaluation.perplexity !== undefined) {
        this.accuracy.add(evaluation.step, "eval perplexity", evaluation.perplexity);
      }
    } else if (evaluation.top1 !== null && evaluation.top1 !== undefined) {
      this.accuracy.add(evaluation.step, "eval top-1", evaluation.top1);
    }
  }

  // Raw telemetry lines from the event stream.
  addRecords(records) {
    for (const record of records) {
      if (record.eval) {
        this.addEvaluation(record);
        continue;
      }
      this.addPoint({ ...record, seq: record.done, loss: { network: record.loss } });
      if (record.timeline) this.latest.set(record.rank, record);
    }
    this.draw();
  }

  draw() {
    this.charts.loss.update();
    this.charts.accuracy.update();
    this.drawSchedules();
  }

  drawSchedules() {
    const predicted = document.getElementById("ft-gantt-predicted");
    if (this.predicted.length) {
      const segments = this.predicted.map((s) => ({ ...s, block: s.microbatch, step: 0 }));
      drawGantt(predicted, { nproc: this.nproc, segments, t0: 0, t1: Math.max(...segments.map((s) => s.end)) });
    } else {
      showEmpty(predicted, "No prediction: the layers were not profiled (finetune.profile: false), or not yet.");
    }
    const measured = document.getElementById("ft-gantt-measured");
    const segments = [...this.latest.values()].flatMap(timelineSegments);
    if (segments.length) drawGantt(measured, { nproc: this.nproc, segments, t0: 0, t1: Math.max(...segments.map((s) => s.end)) });
    else showEmpty(measured, "Appears once the ranks report their first steps.");
  }
}
