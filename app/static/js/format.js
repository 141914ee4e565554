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

// An axis's tick labels, readable at any magnitude: 1.4e-5 rather than 0, 12,000 rather than 12000,
// 2.5e+6 past a million; with just enough digits that neighbouring ticks never read the same.
export function axisLabels(splits) {
  const finite = splits.filter(Number.isFinite);
  const largest = Math.max(0, ...finite.map(Math.abs));
  for (let digits = 0; digits <= 6; digits += 1) {
    const labels = splits.map((value) => axisNumber(value, largest, digits));
    if (new Set(labels).size === new Set(finite).size) return labels;
  }
  return splits.map((value) => axisNumber(value, largest, 6));
}

function axisNumber(value, largest, digits) {
  if (!Number.isFinite(value)) return "";
  if (value === 0) return "0";
  if (largest >= 1e6 || largest < 1e-3) return trimExponent(value.toExponential(Math.max(1, digits)));
  if (largest >= 1000 && digits === 0) return Math.round(value).toLocaleString("en-US");
  return String(Number(value.toFixed(digits + (largest < 1 ? Math.ceil(-Math.log10(largest)) : 0))));
}

// 1.40e-5 as 1.4e-5 (never 1e-5 for 1.0e-5: the mantissa keeps one decimal)
function trimExponent(text) {
  const [mantissa, exponent] = text.split("e");
  const trimmed = mantissa.includes(".") ? mantissa.replace(/0+$/, "").replace(/\.$/, ".0") : mantissa;
  return `${trimmed}e${exponent}`;
}
