// A job's telemetry turned into chart series. Points come from the metrics API (downsampled: one
// point may stand for `count` lines) and from the event stream (raw telemetry lines). Each rank's
// points are kept in order and counted once: a line already drawn (by its `seq`) is skipped.
import { AlignedTable, RateWindows } from "./series.js";

const WAITS = ["recv_wait", "barrier"];
const MIB = 1024 * 1024;
const KEPT_PER_RANK = 64; // raw lines per rank kept for the measured schedule

export function pointFromRecord(record) {
  return { ...record, seq: record.done, count: 1 };
}

const sum = (values) => values.reduce((total, value) => total + value, 0);

function addRange(table, point) {
  for (const [block, value] of Object.entries(point.loss ?? {})) {
    table.add(point.step, `block ${block}`, value);
    table.add(point.step, `block ${block} min`, point.loss_min?.[block] ?? value);
    table.add(point.step, `block ${block} max`, point.loss_max?.[block] ?? value);
  }
}

export class JobTelemetry {
  constructor({ startedAt, numBlocks, nproc }) {
    this.t0 = startedAt ?? null;
    this.numBlocks = numBlocks ?? null;
    this.nproc = nproc;
    this.loss = new AlignedTable();
    this.lossPoints = []; // kept to draw each point's min-max range when asked
    this.lossRange = null;
    this.util = new AlignedTable();
    this.memory = new AlignedTable();
    this.rate = new RateWindows(1);
    this.lastSeq = new Map();
    this.lastTime = new Map();
    this.recent = new Map();
    this.hasArchitecture = false;
    this.blockLatest = new Map(); // block -> {step, sum, count}: its loss at the latest step reported
    this.rankLatest = new Map(); // rank -> {step, busy, gpuUtil, curMem, peakMem} of its latest line
  }

  // The rate windows' width, chosen once from the span of the history: about 150 windows, fewer for
  // fewer lines (about two per rank in each), so that a short job's few tasks still make several points.
  startRate(points) {
    const times = points.map((p) => p.time).filter(Number.isFinite);
    const span = times.length > 1 ? Math.max(...times) - Math.min(...times) : 0;
    if (!(span > 0)) return;
    const windows = Math.min(150, Math.max(2, Math.floor(times.length / (2 * Math.max(1, this.nproc)))));
    this.rate.width = Math.max(span / windows, 1e-3);
  }

  blocksInModel(point) {
    if (this.numBlocks) return this.numBlocks;
    const seen = Object.keys(point.loss ?? {}).map(Number);
    return Math.max(1, ...seen.map((block) => block + 1));
  }

  add(point) {
    const rank = point.rank;
    if (point.seq !== undefined && point.seq <= (this.lastSeq.get(rank) ?? -1)) return false;
    this.lastSeq.set(rank, point.seq ?? 0);
    const phases = point.phases ?? {};
    const taskSeconds = sum(Object.values(phases));
    const count = point.count ?? 1;
    if (this.t0 === null) this.t0 = point.time - taskSeconds;
    const x = point.time - this.t0;
    if (point.round !== "arch") {
      for (const [block, value] of Object.entries(point.loss ?? {})) {
        this.loss.add(point.step, `block ${block}`, value);
        this.keepLatestLoss(block, point.step, value);
      }
      this.lossPoints.push(point);
      if (this.lossRange) addRange(this.lossRange, point);
    }
    const latest = this.rankLatest.get(rank) ?? { peakMem: 0 };
    latest.step = point.step;
    const busy = (taskSeconds - sum(WAITS.map((phase) => phases[phase] ?? 0))) * count;
    const previous = this.lastTime.get(rank);
    const span = previous === undefined ? taskSeconds * count : point.time - previous;
    if (span > 0) {
      latest.busy = Math.min(1, busy / span);
      this.util.add(x, `rank ${rank}`, latest.busy);
    }
    this.lastTime.set(rank, point.time);
    // NVML's GPU utilisation (percent), on CUDA ranks only; drawn next to the busy share, as a fraction
    latest.gpuUtil = Number.isFinite(point.gpu_util) ? point.gpu_util / 100 : null;
    if (latest.gpuUtil !== null) this.util.add(x, `GPU util rank ${rank}`, latest.gpuUtil);
    // memory in use at each task (a downsampled point: its bucket's highest), and the peak so far
    latest.curMem = point.cur_mem ?? null;
    latest.peakMem = Math.max(latest.peakMem, point.peak_mem ?? 0);
    this.rankLatest.set(rank, latest);
    if (point.cur_mem) this.memory.add(x, `rank ${rank}`, point.cur_mem / MIB);
    if (point.peak_mem) this.memory.add(x, `rank ${rank} peak`, point.peak_mem / MIB);
    const distilled = ((point.samples ?? 0) * count * (point.blocks?.length ?? 1)) / this.blocksInModel(point);
    this.rate.add("samples/s", x, distilled);
    if (point.arch) this.hasArchitecture = true;
    return true;
  }

  keepLatestLoss(block, step, value) {
    if (!Number.isFinite(value)) return;
    const latest = this.blockLatest.get(block);
    if (!latest || step > latest.step) this.blockLatest.set(block, { step, sum: value, count: 1 });
    else if (step === latest.step) {
      latest.sum += value;
      latest.count += 1;
    }
  }

  // What the charts show last, for their text equivalents: each block's loss at the latest step it
  // was reported (averaged over the ranks reporting it), by block.
  latestLosses() {
    return [...this.blockLatest.entries()]
      .sort(([a], [b]) => Number(a) - Number(b))
      .map(([block, { step, sum: total, count }]) => ({ block, step, loss: total / count }));
  }

  // Each rank's latest busy share, GPU utilisation, memory in use and peak memory so far, by rank.
  latestRanks() {
    return [...this.rankLatest.entries()].sort(([a], [b]) => a - b).map(([rank, latest]) => ({ rank, ...latest }));
  }

  // Each block's loss with the lowest and highest value each point stands for (downsampled points
  // keep their bucket's extremes): built when first asked for, then kept up to date.
  rangeTable() {
    if (!this.lossRange) {
      this.lossRange = new AlignedTable();
      for (const point of this.lossPoints) addRange(this.lossRange, point);
    }
    return this.lossRange;
  }

  // Raw lines (telemetry records, or undownsampled API points) for the measured schedule; they may
  // repeat lines already drawn as chart points.
  keep(record) {
    const kept = this.recent.get(record.rank) ?? [];
    const seq = record.seq ?? record.done;
    if (kept.length && kept[kept.length - 1].seq >= seq) return;
    kept.push({ ...record, seq });
    if (kept.length > KEPT_PER_RANK) kept.splice(0, kept.length - KEPT_PER_RANK);
    this.recent.set(record.rank, kept);
  }

  addRecords(records) {
    let added = 0;
    for (const record of records) {
      this.keep(record);
      if (this.add(pointFromRecord(record))) added += 1;
    }
    return added;
  }
}
