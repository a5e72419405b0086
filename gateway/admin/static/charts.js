// Charts for the console, drawn as inline SVG: a time-series line chart
// (the overview's rates and queued messages) and a sparkline (a row's
// recent depth).  No library: a few polylines, axes and labels.
"use strict";

const Charts = (() => {
  const SVG = "http://www.w3.org/2000/svg";

  function node(name, attrs, parent) {
    const el = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
    if (parent) parent.append(el);
    return el;
  }

  // A short human number: 1234 -> "1.2k", 5.5e6 -> "5.5M"; bytes with unit "B".
  function short(value, unit) {
    const steps = unit === "B" ? [[2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]] : [[1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [size, suffix] of steps) {
      if (Math.abs(value) >= size) return (value / size).toFixed(1) + (unit === "B" ? " " : "") + suffix;
    }
    const text = Number.isInteger(value) ? String(value) : value.toFixed(value < 10 ? 2 : 1).replace(/\.?0+$/, "");
    return unit === "B" ? text + " B" : text;
  }

  // A line chart of ``series`` ([{label, key, color}]) over ``samples``
  // ([{t, <key>: number}]), the time axis from the first sample to now.
  function line(samples, series, options = {}) {
    const width = 560, height = 170, left = 64, right = 10, top = 10, bottom = 34;
    const svg = node("svg", {viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img"});
    node("title", {}, svg).textContent = options.title || "";
    const plotW = width - left - right, plotH = height - top - bottom;
    const t0 = samples.length ? samples[0].t : 0, t1 = samples.length ? samples[samples.length - 1].t : 1;
    let max = 0;
    for (const s of samples) for (const {key} of series) max = Math.max(max, s[key] || 0);
    max = max > 0 ? max * 1.1 : 1;
    const x = (t) => left + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * plotW;
    const y = (v) => top + plotH - (v / max) * plotH;
    for (const fraction of [0, 0.5, 1]) {
      const yy = top + plotH - fraction * plotH;
      node("line", {x1: left, x2: width - right, y1: yy, y2: yy, class: "grid"}, svg);
      node("text", {x: left - 4, y: yy + 4, class: "tick", "text-anchor": "end"}, svg).textContent = short(max * fraction, options.unit);
    }
    const span = (t1 - t0) / 60000;
    node("text", {x: left, y: height - 18, class: "tick"}, svg).textContent =
      samples.length > 1 ? (span >= 1 ? span.toFixed(0) + " min ago" : Math.round(span * 60) + " s ago") : "";
    node("text", {x: width - right, y: height - 18, class: "tick", "text-anchor": "end"}, svg).textContent = "now";
    let legendX = left;
    for (const {label, key, color} of series) {
      const points = samples.map((s) => `${x(s.t).toFixed(1)},${y(s[key] || 0).toFixed(1)}`).join(" ");
      node("polyline", {points, fill: "none", stroke: color, "stroke-width": 2, class: "series", "data-key": key}, svg);
      node("rect", {x: legendX, y: height - 10, width: 10, height: 4, fill: color}, svg);
      const latest = samples.length ? samples[samples.length - 1][key] || 0 : 0;
      const text = node("text", {x: legendX + 14, y: height - 5, class: "legend"}, svg);
      text.textContent = `${label} ${short(latest, options.unit)}`;
      legendX += 30 + text.textContent.length * 6.5;
    }
    if (samples.length < 2) {
      node("text", {x: left + plotW / 2, y: top + plotH / 2, class: "tick", "text-anchor": "middle"}, svg).textContent =
        "collecting samples\u2026";
    }
    return svg;
  }

  // A sparkline of ``values`` (numbers, oldest first).
  function sparkline(values, color = "#2f6fde") {
    const width = 90, height = 22;
    const svg = node("svg", {viewBox: `0 0 ${width} ${height}`, class: "spark", width, height});
    if (values.length === 0) return svg;
    const max = Math.max(1, ...values);
    const step = values.length > 1 ? width / (values.length - 1) : 0;
    const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`);
    if (values.length === 1) points.push(`${width},${points[0].split(",")[1]}`);
    node("polyline", {points: points.join(" "), fill: "none", stroke: color, "stroke-width": 1.5}, svg);
    return svg;
  }

  return {line, sparkline, short};
})();
