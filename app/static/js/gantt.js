// Schedules per rank as SVG timelines: the planner's simulation (predicted) and the ranks' own phase
// times (measured). A measured telemetry line ends at `time`; walking back through its phases in
// reverse execution order rebuilds when each phase ran.
import { millis, ticks } from "./format.js";

const EXECUTION_ORDER = ["data", "recv_wait", "teacher", "send", "student", "allreduce", "barrier", "optim"];
const LETTERS = {
  data: "D", recv_wait: "…", recv: "R", teacher: "T", send: "→", student: "S", allreduce: "A", barrier: "B", optim: "O",
  F: "F", B: "B", I: "I", W: "W",
};
const NAMES = {
  data: "loading data", recv_wait: "waiting for input", recv: "receiving", teacher: "teacher", send: "sending",
  student: "student", allreduce: "all-reduce", barrier: "barrier", optim: "optimiser step",
  F: "forward", B: "backward", I: "input gradient", W: "weight gradient",
};
const MICROBATCH_KINDS = ["F", "B", "I", "W"]; // end-to-end training: labelled with their micro-batch
const DARK = new Set(["data", "teacher", "optim", "F", "I"]);
const SVG = "http://www.w3.org/2000/svg";
const LABEL_WIDTH = 58;
const ROW_HEIGHT = 22;
const ROW_GAP = 5;
const AXIS_HEIGHT = 22;
const TASKS_SHOWN = 3; // the measured view spans the slowest rank's last few tasks

export function taskSegments(record) {
  const segments = [];
  let end = record.time;
  for (const kind of [...EXECUTION_ORDER].reverse()) {
    const seconds = record.phases?.[kind] ?? 0;
    if (seconds <= 0) continue;
    segments.push({ rank: record.rank, kind, blocks: record.blocks ?? [], step: record.step, start: end - seconds, end });
    end -= seconds;
  }
  return segments.reverse();
}

// The latest stretch of time every rank has reported, long enough for the slowest rank's last tasks.
export function measuredWindow(recentByRank) {
  const ranks = [...recentByRank.values()].filter((records) => records.length);
  if (!ranks.length) return null;
  const end = Math.min(...ranks.map((records) => records[records.length - 1].time));
  let length = 0;
  for (const records of ranks) {
    const upToEnd = records.filter((record) => record.time <= end + 1e-9);
    const last = upToEnd.slice(-TASKS_SHOWN);
    if (!last.length) continue;
    const first = taskSegments(last[0]);
    const start = first.length ? first[0].start : last[0].time;
    length = Math.max(length, end - start);
  }
  const t0 = end - Math.max(length, 1e-6);
  const segments = ranks.flat().flatMap(taskSegments).filter((s) => s.end > t0 && s.start < end);
  return { segments, t0, t1: end };
}

function element(name, attributes = {}, text = null) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

function blockText(segment) {
  if (segment.block !== undefined && segment.block !== null) return String(segment.block);
  const blocks = segment.blocks ?? [];
  if (!blocks.length) return "";
  return blocks.length === 1 ? String(blocks[0]) : `${blocks[0]}–${blocks[blocks.length - 1]}`;
}

function drawSegment(group, segment, x, y, width) {
  const blocks = blockText(segment);
  const rect = element("rect", { class: `seg k-${segment.kind}`, x, y, width: Math.max(width, 0.5), height: ROW_HEIGHT });
  const unit = MICROBATCH_KINDS.includes(segment.kind) ? "micro-batch" : "block";
  const what = `${NAMES[segment.kind] ?? segment.kind}${blocks && segment.kind !== "data" ? ` (${unit} ${blocks})` : ""}`;
  rect.append(element("title", {}, `rank ${segment.rank}: ${what}, step ${segment.step}, ${millis(segment.end - segment.start)}`));
  group.append(rect);
  const numbered = ["teacher", "student", ...MICROBATCH_KINDS].includes(segment.kind);
  const label = `${LETTERS[segment.kind] ?? "?"}${numbered ? blocks : ""}`;
  if (width >= label.length * 7 + 4) {
    const textClass = `seg-label${DARK.has(segment.kind) ? " on-dark" : ""}`;
    group.append(element("text", { class: textClass, x: x + width / 2, y: y + ROW_HEIGHT / 2 + 4, "text-anchor": "middle" }, label));
  }
}

// Draw one row per rank (rows stay even when a rank has no segment in the window).
export function drawGantt(container, { nproc, segments, t0, t1 }) {
  const width = Math.max(280, container.clientWidth || 800);
  const plotWidth = width - LABEL_WIDTH - 8;
  const height = nproc * (ROW_HEIGHT + ROW_GAP) + AXIS_HEIGHT;
  const span = Math.max(t1 - t0, 1e-9);
  const xOf = (t) => LABEL_WIDTH + ((t - t0) / span) * plotWidth;
  const svg = element("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img" });
  svg.append(element("title", {}, `Schedule of ${nproc} ranks over ${millis(span)}`));
  for (const tick of ticks(span)) {
    const x = xOf(t0 + tick);
    svg.append(element("line", { class: "grid", x1: x, x2: x, y1: 0, y2: height - AXIS_HEIGHT }));
    svg.append(element("text", { class: "axis", x, y: height - 6, "text-anchor": "middle" }, millis(tick)));
  }
  for (let rank = 0; rank < nproc; rank += 1) {
    const y = rank * (ROW_HEIGHT + ROW_GAP);
    const group = element("g", { class: "gantt-row", "data-rank": rank });
    group.append(element("rect", { class: "row-bg", x: LABEL_WIDTH, y, width: plotWidth, height: ROW_HEIGHT }));
    group.append(element("text", { class: "row-label", x: 4, y: y + ROW_HEIGHT / 2 + 4 }, `rank ${rank}`));
    for (const segment of segments.filter((s) => s.rank === rank)) {
      const x = xOf(Math.max(segment.start, t0));
      drawSegment(group, segment, x, y, xOf(Math.min(segment.end, t1)) - x);
    }
    svg.append(group);
  }
  container.replaceChildren(svg);
  container.dataset.rows = String(nproc);
}

export function showEmpty(container, text) {
  const note = document.createElement("p");
  note.className = "empty";
  note.textContent = text;
  container.replaceChildren(note);
  container.dataset.rows = "0";
}
