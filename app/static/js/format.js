// Number formatting shared by the charts and schedules.

export function millis(seconds) {
  const ms = seconds * 1000;
  if (!Number.isFinite(ms)) return "—";
  return ms >= 100 ? `${ms.toFixed(0)} ms` : ms >= 1 ? `${ms.toFixed(2)} ms` : `${(ms * 1000).toFixed(0)} µs`;
}

export function mebibytes(value) {
  return value >= 1024 ? `${(value / 1024).toFixed(2)} GiB` : `${value.toFixed(0)} MiB`;
}

export function compact(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "";
  const size = Math.abs(value);
  if (size >= 1000) return value.toFixed(0);
  if (size >= 10) return value.toFixed(1);
  if (size >= 0.01 || size === 0) return value.toFixed(3).replace(/\.?0+$/, "") || "0";
  return value.toExponential(1);
}

// Round tick positions covering [0, span]: steps of 1, 2 or 5 times a power of ten.
export function ticks(span, count = 5) {
  if (!(span > 0)) return [0];
  const raw = span / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const out = [];
  for (let t = 0; t <= span + step * 1e-9; t += step) out.push(t);
  return out;
}
