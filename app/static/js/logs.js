// The log panel: the tail of one phase's launcher log or one rank's log, followed while the job runs.
// The event stream says when a log grew (a `log` event names its phase and rank, never its lines); the
// panel then reads the file from where it stopped (`next_offset`), so no line is shown twice or skipped.
import { getJSON } from "./server.js";

const TAIL_BYTES = 64 * 1024;
const MAX_SHOWN = 400 * 1024; // characters kept in the panel

// A log as a terminal shows it: a carriage return (a progress bar redrawing itself) goes back to the
// start of the line and the text after it overwrites what was there, so each line shows its last state.
export function lastStates(text) {
  return text
    .replace(/\r\n/g, "\n")
    .split("\n")
    .map((line) => line.split("\r").reduce((shown, part) => part + shown.slice(part.length)))
    .join("\n");
}

export class LogPanel {
  // available: the job has a run directory (a worker started it); before that the API has no logs.
  constructor({ jobId, select, phaseSelect, follow, output, available }) {
    this.jobId = jobId;
    this.available = available;
    this.select = select;
    this.phaseSelect = phaseSelect;
    this.picked = false; // the reader chose a phase: a new phase no longer switches the panel to it
    this.follow = follow;
    this.output = output;
    this.offset = 0;
    this.raw = ""; // the text read, carriage returns and all (a chunk may end inside a redrawn line)
    this.busy = false;
    this.again = false;
    select.addEventListener("change", () => this.load());
    phaseSelect.addEventListener("change", () => {
      this.picked = true;
      this.load();
    });
  }

  // "" is node 0's launcher log, "node-K" node K's (a job on several nodes), a number a rank's log.
  url(offset, limit) {
    const value = this.select.value;
    const source = value === "" ? "" : value.startsWith("node-") ? `&node=${value.slice(5)}` : `&rank=${value}`;
    return `/api/v1/jobs/${this.jobId}/logs?phase=${this.phaseSelect.value}&offset=${offset}&limit=${limit}${source}`;
  }

  // A new phase started: show its logs, unless the reader picked a phase to read; a phase of one
  // process (finalize, evaluate) has only its launcher log.
  phaseChanged(phase, runs) {
    const option = [...this.phaseSelect.options].find((entry) => entry.value === phase);
    if (this.picked || !option || this.phaseSelect.value === phase) return;
    this.phaseSelect.value = phase;
    if (runs === "process") this.select.value = "";
    this.offset = 0;
    this.load();
  }

  async load() {
    if (!this.available) {
      this.show("No logs yet: they appear once a worker starts the job.", false);
      return;
    }
    try {
      const head = await getJSON(this.url(0, 1));
      const start = Math.max(0, head.size - TAIL_BYTES);
      const chunk = await getJSON(this.url(start, TAIL_BYTES));
      let text = chunk.text;
      if (start > 0) text = `… (earlier lines omitted)\n${text.slice(text.indexOf("\n") + 1)}`;
      this.offset = chunk.next_offset;
      this.show(text || "(nothing written to this log yet)", false);
    } catch (error) {
      this.offset = 0;
      this.show(`Could not read the log: ${error.message}`, false);
    }
  }

  show(text, append) {
    const atBottom = this.output.scrollTop + this.output.clientHeight >= this.output.scrollHeight - 8;
    let value = append ? this.raw + text : text;
    if (value.length > MAX_SHOWN) value = value.slice(value.length - MAX_SHOWN);
    this.raw = value;
    this.output.textContent = lastStates(value);
    if (atBottom || !append) this.output.scrollTop = this.output.scrollHeight;
  }

  // The job now has a run directory (a worker took it): its logs can be read.
  async started() {
    if (this.available) return;
    this.available = true;
    await this.load();
  }

  // A `log` event for `rank` (null: the launcher) of `phase` arrived: read what is new if we show that log.
  async grew(phase, rank) {
    if (!this.available) {
      await this.started();
      return;
    }
    const value = this.select.value;
    const shown = value === "" ? null : value.startsWith("node-") ? undefined : Number(value); // node K: not followed
    if (!this.follow.checked || shown !== rank || this.phaseSelect.value !== phase) return;
    if (this.busy) {
      this.again = true;
      return;
    }
    this.busy = true;
    try {
      if (this.offset === 0) {
        await this.load();
      } else {
        const chunk = await getJSON(this.url(this.offset, TAIL_BYTES));
        if (chunk.text) this.show(chunk.text, true);
        this.offset = chunk.next_offset;
      }
    } finally {
      this.busy = false;
    }
    if (this.again) {
      this.again = false;
      this.grew(phase, rank);
    }
  }
}
