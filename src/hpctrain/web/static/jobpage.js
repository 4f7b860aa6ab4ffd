// hpctrain web console, a job's page: plots of loss, accuracy and images/s over steps (SVG drawn here from the
// console's JSON, numbers only), and the copy button of the shell command. Text is only ever set as textContent.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 320;
const HEIGHT = 170;
const PAD = { left: 46, right: 10, top: 10, bottom: 24 };

function svgNode(tag, attributes) {
  const node = document.createElementNS(SVG, tag);
  Object.entries(attributes || {}).forEach(([key, value]) => node.setAttribute(key, String(value)));
  return node;
}

function label(value) {
  const size = Math.abs(value);
  if (size >= 1e4) return value.toExponential(1);
  if (size >= 100) return value.toFixed(0);
  if (size >= 1) return value.toFixed(2);
  return value.toPrecision(2);
}

// One series ([[step, value], ...], finite numbers from the console) as a small line plot with its axes' ranges.
function plot(series) {
  const points = series.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
  const figure = document.createElement("figure");
  figure.className = "plot";
  figure.dataset.key = series.key;
  figure.dataset.points = String(points.length);
  const caption = document.createElement("figcaption");
  caption.textContent = series.label + " (" + points.length + " point" + (points.length === 1 ? "" : "s") + ")";
  const svg = svgNode("svg", { class: "plot", width: WIDTH, height: HEIGHT, viewBox: `0 0 ${WIDTH} ${HEIGHT}` });
  const x0 = PAD.left;
  const x1 = WIDTH - PAD.right;
  const y0 = HEIGHT - PAD.bottom;
  const y1 = PAD.top;
  svg.appendChild(svgNode("line", { class: "axis", x1: x0, y1: y0, x2: x1, y2: y0 }));
  svg.appendChild(svgNode("line", { class: "axis", x1: x0, y1: y0, x2: x0, y2: y1 }));
  if (points.length) {
    const steps = points.map((p) => p[0]);
    const values = points.map((p) => p[1]);
    const [sMin, sMax] = [Math.min(...steps), Math.max(...steps)];
    let [vMin, vMax] = [Math.min(...values), Math.max(...values)];
    if (vMin === vMax) [vMin, vMax] = [vMin - 1, vMax + 1];
    const x = (s) => (sMax === sMin ? (x0 + x1) / 2 : x0 + ((s - sMin) / (sMax - sMin)) * (x1 - x0));
    const y = (v) => y0 - ((v - vMin) / (vMax - vMin)) * (y0 - y1);
    const path = points.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1)).join(" ");
    svg.appendChild(svgNode("path", { class: "series", d: path }));
    points.forEach((p) => svg.appendChild(svgNode("circle", { class: "point", cx: x(p[0]), cy: y(p[1]), r: 2.2 })));
    const text = (content, attributes) => {
      const node = svgNode("text", attributes);
      node.textContent = content;
      svg.appendChild(node);
    };
    text(label(vMax), { x: x0 - 4, y: y1 + 8, "text-anchor": "end" });
    text(label(vMin), { x: x0 - 4, y: y0, "text-anchor": "end" });
    text("step " + sMin, { x: x0, y: HEIGHT - 6 });
    text("step " + sMax, { x: x1, y: HEIGHT - 6, "text-anchor": "end" });
  }
  figure.append(caption, svg);
  return figure;
}

// Polled as the details are (console.js's poll: paused while the tab is in the background); once the details say
// the job has ended, asked for one more interval (the console's copy then holds what the job wrote as it ended),
// then no more.
function followPlots(box) {
  const state = document.getElementById("plot-state");
  const details = document.getElementById("details");
  let shown = null;
  let afterEnd = 0;
  const show = (data) => {
    if (details && details.dataset.ended) afterEnd += 1;
    const more = afterEnd < 2;
    const text = JSON.stringify(data);
    if (text === shown) return more;
    shown = text;
    const drawn = data.series.filter((s) => s.points.length);
    box.replaceChildren(...drawn.map(plot));
    if (state) {
      state.textContent = data.records ? data.records + " epoch record(s) in metrics.jsonl" : "no metrics.jsonl record yet";
    }
    return more;
  };
  const status = (error) => error && state && (state.textContent = error);
  poll(box.dataset.src, parseFloat(box.dataset.interval) || 5, show, status);
}

function copyButtons() {
  document.querySelectorAll("button.copy[data-copy]").forEach((button) => {
    button.addEventListener("click", () => {
      const source = document.getElementById(button.dataset.copy);
      if (!source) return;
      const done = () => {
        button.textContent = "copied";
        setTimeout(() => (button.textContent = "copy"), 1500);
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(source.textContent).then(done, () => {
          selectText(source); // the browser refused the clipboard: select it for Ctrl-C
          button.textContent = "selected: Ctrl-C";
        });
      } else {
        selectText(source); // no clipboard API (plain http through a tunnel): select it for Ctrl-C
        button.textContent = "selected: Ctrl-C";
      }
    });
  });
}

function selectText(node) {
  const range = document.createRange();
  range.selectNodeContents(node);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}

document.addEventListener("DOMContentLoaded", () => {
  const plots = document.getElementById("plots");
  if (plots) followPlots(plots);
  copyButtons();
});
