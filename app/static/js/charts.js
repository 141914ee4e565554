// Line charts (uPlot) that grow as points arrive: `update()` redraws the canvas with the new data on
// the next animation frame; the page itself is never reloaded. Series differ by colour (Okabe-Ito)
// and by dash pattern, and each is named in the legend.
import uPlot from "../vendor/uplot-1.6.32/uPlot.esm.js";
import { axisLabels, compact } from "./format.js";

export const PALETTE = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000", "#f0e442"];
const DASHES = [[], [8, 4], [2, 3], [12, 3, 3, 3]];
const HEIGHT = 230;
const FEW_POINTS = 40; // a series with at most this many points marks each one (a short job's few are seen)

export function seriesStyle(index) {
  return { stroke: PALETTE[index % PALETTE.length], dash: DASHES[index % DASHES.length], width: 2 };
}

// Companion series are drawn thin in the colour of the series they belong to: `<name> min` and
// `<name> max` dotted (a loss point's range), `<name> peak` dashed (memory's peak next to memory
// in use), `GPU util <name>` solid with a marker at each point (NVML utilisation next to the busy
// share). A companion whose own series is absent is drawn as a series of its own.
const COMPANIONS = [
  [/^(.*) (min|max)$/, { dash: [1, 3], width: 1 }],
  [/^(.*) peak$/, { dash: [5, 4], width: 1 }],
  [/^GPU util (.*)$/, { dash: [], width: 1, points: { show: true, size: 4, fill: "#ffffff" } }],
];

function companionOf(key, keys) {
  for (const [pattern, style] of COMPANIONS) {
    const found = pattern.exec(String(key));
    if (found && keys.includes(found[1])) return { owner: found[1], style };
  }
  return null;
}

// few: mark each point of the main series (a line through one or two points is hardly seen)
function stylesOf(keys, few = false) {
  const main = keys.filter((key) => !companionOf(key, keys));
  return keys.map((key) => {
    const companion = companionOf(key, keys);
    if (!companion) return { ...seriesStyle(main.indexOf(key)), points: few ? { show: true, size: 6 } : { show: false } };
    const stroke = PALETTE[main.indexOf(companion.owner) % PALETTE.length];
    const points = { show: false, stroke, ...companion.style.points };
    return { ...companion.style, stroke, points };
  });
}

// The x range asked for, widened to take in every point drawn.
function widened(range, min, max) {
  if (!range) return [min, max];
  const [low, high] = range;
  return [Math.min(low, min ?? low), Math.max(high, max ?? high)];
}

export class LiveChart {
  // figure: a <figure> with a `.plot` element; source: {keys, points, data()}
  // xRange: a function giving the x axis's [min, max] (e.g. 0 to the job's duration), null to fit the points
  constructor(figure, source, { xLabel, yLabel, log = false, yRange = null, format = null, xRange = null }) {
    this.figure = figure;
    this.plot = figure.querySelector(".plot");
    this.source = source;
    this.options = { xLabel, yLabel, yRange, format, xRange };
    this.log = log;
    this.chart = null;
    this.emptyText = "No points yet: they appear as the ranks report.";
    this.drawnKeys = 0;
    this.pending = false;
    new ResizeObserver(() => this.resize()).observe(this.plot);
  }

  width() {
    return Math.max(200, this.plot.clientWidth || 600);
  }

  build() {
    this.chart?.destroy();
    const { xLabel, yLabel, yRange, format, xRange } = this.options;
    // the labels drawn are also kept on the figure (data-y-labels), for tests and assistive tools
    const yValues = (_, splits) => {
      const labels = format ? splits.map(format) : axisLabels(splits);
      this.figure.dataset.yLabels = labels.join("|");
      return labels;
    };
    const yAxis = { label: yLabel, size: 60, values: yValues };
    const y = this.log ? { distr: 3, log: 10 } : yRange ? { range: yRange } : {};
    const x = { time: false };
    if (xRange) x.range = (_, min, max) => widened(xRange(), min, max);
    const data = this.source.data();
    const few = data[0].length <= FEW_POINTS;
    const styles = stylesOf(this.source.keys, few);
    const options = {
      width: this.width(),
      height: HEIGHT,
      scales: { x, y },
      axes: [{ label: xLabel, values: (_, splits) => axisLabels(splits) }, yAxis],
      legend: { live: true },
      hooks: {
        // the x range drawn, kept on the figure like the labels (data-x-range="min|max")
        setScale: [(u, key) => { if (key === "x") this.figure.dataset.xRange = `${u.scales.x.min}|${u.scales.x.max}`; }],
      },
      series: [
        { label: xLabel },
        ...this.source.keys.map((key, index) => {
          const series = { label: String(key), ...styles[index], spanGaps: true };
          series.value = (_, v) => (v === null || v === undefined ? "—" : (format ?? compact)(v));
          return series;
        }),
      ],
    };
    this.plot.replaceChildren();
    this.chart = new uPlot(options, data, this.plot);
    this.drawnKeys = this.source.keys.length;
    this.few = few;
  }

  // Draw the source's current data on the next frame (many appends in one frame draw once).
  update() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.figure.dataset.points = String(this.source.points);
      const values = this.source.data().slice(1).flat().filter((value) => value !== null && value !== undefined);
      this.figure.dataset.drawn = String(values.length); // the values on the canvas (a window of a rate is one)
      if (this.source.points === 0) {
        if (!this.chart) this.plot.innerHTML = `<p class="waiting">${this.emptyText}</p>`;
        return;
      }
      const data = this.source.data();
      const few = data[0].length <= FEW_POINTS;
      if (!this.chart || this.drawnKeys !== this.source.keys.length || few !== this.few) this.build();
      else this.chart.setData(data);
    });
  }

  setLog(log) {
    this.log = log;
    if (this.chart) this.build();
  }

  setSource(source) {
    this.source = source;
    this.chart?.destroy();
    this.chart = null;
    this.update();
  }

  resize() {
    if (this.chart && Math.abs(this.chart.width - this.width()) > 2) this.chart.setSize({ width: this.width(), height: HEIGHT });
  }
}
