// Chart data that grows point by point, in the column layout uPlot draws: [xs, series1, series2, ...].

// Points on a shared, sorted x axis; several values at one (x, key) are averaged (e.g. the loss of a
// replicated block reported by each of its replicas). A key seen for the first time adds a column.
export class AlignedTable {
  constructor() {
    this.xs = [];
    this.keys = [];
    this.sums = [];
    this.counts = [];
    this.columns = new Map();
    this.points = 0;
  }

  column(key) {
    if (!this.columns.has(key)) {
      this.columns.set(key, this.keys.length);
      this.keys.push(key);
      this.sums.push(new Array(this.xs.length).fill(null));
      this.counts.push(new Array(this.xs.length).fill(0));
    }
    return this.columns.get(key);
  }

  row(x) {
    const xs = this.xs;
    if (xs.length === 0 || x > xs[xs.length - 1]) {
      xs.push(x);
      this.sums.forEach((column) => column.push(null));
      this.counts.forEach((column) => column.push(0));
      return xs.length - 1;
    }
    let low = 0;
    let high = xs.length;
    while (low < high) {
      const middle = (low + high) >> 1;
      if (xs[middle] < x) low = middle + 1;
      else high = middle;
    }
    if (xs[low] !== x) {
      xs.splice(low, 0, x);
      this.sums.forEach((column) => column.splice(low, 0, null));
      this.counts.forEach((column) => column.splice(low, 0, 0));
    }
    return low;
  }

  add(x, key, value) {
    if (value === null || value === undefined || !Number.isFinite(value) || !Number.isFinite(x)) return;
    const column = this.column(key);
    const index = this.row(x);
    this.sums[column][index] = (this.sums[column][index] ?? 0) + value;
    this.counts[column][index] += 1;
    this.points += 1;
  }

  data() {
    const columns = this.sums.map((sums, c) => sums.map((sum, i) => (sum === null ? null : sum / this.counts[c][i])));
    return [this.xs, ...columns];
  }
}

// Amounts summed per time window and shown per second: e.g. samples distilled per second, one
// column per key (a job). Windows double in width when there are too many of them.
export class RateWindows {
  constructor(width = 1, maxWindows = 600) {
    this.width = width;
    this.maxWindows = maxWindows;
    this.keys = [];
    this.windows = new Map(); // key -> Map(window index -> amount)
    this.latest = new Map(); // key -> largest x seen: the last window is only filled up to there
    this.points = 0;
  }

  column(key) {
    if (!this.windows.has(key)) {
      this.windows.set(key, new Map());
      this.keys.push(key);
    }
    return this.windows.get(key);
  }

  add(key, x, amount) {
    if (!Number.isFinite(x) || !Number.isFinite(amount)) return;
    const sums = this.column(key);
    this.latest.set(key, Math.max(this.latest.get(key) ?? 0, x));
    const index = Math.floor(Math.max(0, x) / this.width);
    sums.set(index, (sums.get(index) ?? 0) + amount);
    this.points += 1;
    if (sums.size > this.maxWindows) this.coarsen();
  }

  coarsen() {
    this.width *= 2;
    for (const [key, sums] of this.windows) {
      const merged = new Map();
      for (const [index, amount] of sums) merged.set(index >> 1, (merged.get(index >> 1) ?? 0) + amount);
      this.windows.set(key, merged);
    }
  }

  // One key's latest window, average since x = 0 and highest window, per second (null without amounts).
  summary(key) {
    const sums = this.windows.get(key);
    if (!sums?.size) return null;
    const [xs, ...columns] = this.data();
    const values = columns[this.keys.indexOf(key)];
    const filled = values.map((value, index) => [value, xs[index]]).filter(([value]) => value !== null);
    const total = [...sums.values()].reduce((a, b) => a + b, 0);
    const until = this.latest.get(key);
    return {
      latest: filled[filled.length - 1][0],
      mean: until > 0 ? total / until : null,
      highest: Math.max(...filled.map(([value]) => value)),
      width: this.width,
      until,
    };
  }

  data() {
    const indices = [...new Set([...this.windows.values()].flatMap((sums) => [...sums.keys()]))].sort((a, b) => a - b);
    const xs = indices.map((index) => (index + 0.5) * this.width);
    const columns = this.keys.map((key) => {
      const sums = this.windows.get(key);
      const last = Math.max(...sums.keys());
      const filled = (index) =>
        index === last ? Math.min(this.width, Math.max(0.25 * this.width, this.latest.get(key) - index * this.width)) : this.width;
      return indices.map((index) => (sums.has(index) ? sums.get(index) / filled(index) : null));
    });
    return [xs, ...columns];
  }
}
