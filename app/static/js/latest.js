// Text equivalents of the job page's charts, for the keyboard and screen readers: under each chart a
// collapsed "Latest values" table (each block's latest loss, the throughput's latest, average and
// highest windows, each rank's busy share and GPU utilisation, memory in use and peak), filled from
// the telemetry the charts draw. A table is rendered when opened and, while open, at most once per
// animation frame as points arrive; a closed one costs nothing.
import { mebibytes } from "./format.js";

const MIB = 1024 * 1024;
const DASH = "—";
const finite = (value) => value !== null && value !== undefined && Number.isFinite(value);
const percent = (fraction) => (finite(fraction) ? `${Math.round(fraction * 100)}%` : DASH);
const loss = (value) => (finite(value) ? String(Number(value.toPrecision(4))) : DASH);
const memory = (bytes) => (finite(bytes) && bytes > 0 ? mebibytes(bytes / MIB) : DASH);
const rate = (value) => (finite(value) ? (value >= 100 ? value.toFixed(0) : value.toFixed(1)) : DASH);
const seconds = (value) => `${value >= 10 ? value.toFixed(0) : value.toFixed(1)} s`;

// chart name -> the rows of its table, each a list of cells (the first one heads its row)
const ROWS = {
  loss: (telemetry) => telemetry.latestLosses().map((b) => [`block ${b.block}`, String(b.step), loss(b.loss)]),
  throughput: (telemetry) => {
    const found = telemetry.rate.summary("samples/s");
    if (!found) return [];
    return [
      [`latest (${seconds(found.width)} window, ${seconds(found.until)} after the start)`, rate(found.latest)],
      ["average since the start", rate(found.mean)],
      [`highest ${seconds(found.width)} window`, rate(found.highest)],
    ];
  },
  util: (telemetry) => telemetry.latestRanks().map((r) => [`rank ${r.rank}`, percent(r.busy), percent(r.gpuUtil)]),
  memory: (telemetry) => telemetry.latestRanks().map((r) => [`rank ${r.rank}`, memory(r.curMem), memory(r.peakMem)]),
};

function tableRow(cells) {
  const row = document.createElement("tr");
  cells.forEach((text, index) => {
    const cell = document.createElement(index === 0 ? "th" : "td");
    if (index === 0) cell.scope = "row";
    cell.textContent = text;
    row.append(cell);
  });
  return row;
}

export class LatestValues {
  // details: chart name -> its <details> (a table with a <tbody> inside)
  constructor(telemetry, details) {
    this.telemetry = telemetry;
    this.details = Object.entries(details).filter(([name, element]) => element && ROWS[name]);
    this.pending = false;
    for (const [name, element] of this.details) {
      element.addEventListener("toggle", () => element.open && this.render(name, element));
    }
  }

  render(name, element) {
    const rows = ROWS[name](this.telemetry);
    const body = element.querySelector("tbody");
    if (rows.length) body.replaceChildren(...rows.map(tableRow));
    element.dataset.rows = String(rows.length);
  }

  // Redraw the open tables on the next frame (many updates in one frame render once).
  update() {
    if (this.pending || !this.details.some(([, element]) => element.open)) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      for (const [name, element] of this.details) if (element.open) this.render(name, element);
    });
  }
}
