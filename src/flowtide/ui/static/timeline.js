// The Timeline tab: a Gantt chart of an execution. One lane per step with its runs, the
// step's commands packed into sub-lanes (or, for steps with very many commands, a density
// histogram), a relative time axis and a line at the end. Polled every 2 s while running.
import { api, enc } from './api.js';
import { h, svg, statusClass, duration, truncate, message, Poller, TERMINAL, STOPPED } from './util.js';

const LABEL_W = 140;
const PAD_L = 8;
const PAD_R = 24;
const AXIS_H = 26;
const ROW_H = 20; // the row holding a step's run bars
const RUN_H = 12;
const SUB_H = 5; // one command sub-lane
const SUB_GAP = 2;
const MAX_SUB = 12;
const DENS_H = 46; // density lane: a text line above the columns
const DENS_BARS = 30;
const LANE_PAD = 6;
const MIN_W = 600;
const MAX_ZOOM = 256;
const NICE = [0.001, 0.002, 0.0025, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, 15,
  30, 60, 120, 180, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
const LEGEND = ['running', 'completed', 'failed', 'cancelled', 'interrupted', 'skipped'];

const num = (n, digits = 0) => Number(n).toLocaleString('en-US', { maximumFractionDigits: digits });
const secs = (d) => (d < 60 ? `${Math.max(0, d).toFixed(2)} s` : duration(d));
const f1 = (v) => Math.round(v * 10) / 10;

/** An axis label for t seconds after the start: "0 s", "1.5 s", "2 m 10 s", "1 h 5 m". */
function tickLabel(t) {
  const r = Math.round(t * 1000) / 1000;
  const hr = Math.floor(r / 3600);
  const m = Math.floor((r - hr * 3600) / 60);
  const s = parseFloat((r - hr * 3600 - m * 60).toFixed(3));
  const parts = [];
  if (hr) parts.push(`${hr} h`);
  if (m) parts.push(`${m} m`);
  if (s || !parts.length) parts.push(`${s} s`);
  return parts.join(' ');
}

/** A round tick interval: about 7 over the whole span, never closer than 80 px. */
function tickStep(span, pps) {
  const want = Math.max(span / 7, 80 / pps);
  return NICE.find((n) => n >= want) ?? Math.ceil(want / 86400) * 86400;
}

/** Greedy interval packing: sets item.lane (first free sub-lane); past MAX_SUB, the last. */
function pack(items) {
  const ends = [];
  let overflow = false;
  for (const it of [...items].sort((x, y) => x.a - y.a)) {
    let i = ends.findIndex((e) => e <= it.a);
    if (i < 0 && ends.length >= MAX_SUB) { i = MAX_SUB - 1; overflow = true; }
    if (i < 0) i = ends.length;
    ends[i] = Math.max(ends[i] ?? -Infinity, it.b);
    it.lane = i;
  }
  return { count: ends.length, overflow };
}

function densityLane(d, total, y, X, t0) {
  const w = Number(d.width) || 0;
  const comp = d.completed;
  const fail = Array.isArray(d.failed) ? d.failed : [];
  const max = comp.reduce((m, c, i) => Math.max(m, (c || 0) + (fail[i] || 0)), 0);
  const peak = w > 0 ? max / w : 0;
  const base = y + DENS_H - 2;
  let pc = '';
  let pf = '';
  if (max > 0 && w > 0) {
    comp.forEach((c0, i) => {
      const c = c0 || 0;
      const f = fail[i] || 0;
      if (!c && !f) return;
      const xa = X(t0 + i * w);
      const bw = f1(Math.max(1, X(t0 + (i + 1) * w) - xa));
      const hc = c ? Math.max(1, (c / max) * DENS_BARS) : 0;
      const hf = f ? Math.max(1, (f / max) * DENS_BARS) : 0;
      if (c) pc += `M${f1(xa)},${f1(base - hc)}h${bw}V${base}h${-bw}z`;
      if (f) pf += `M${f1(xa)},${f1(base - hc - hf)}h${bw}v${f1(hf)}h${-bw}z`;
    });
  }
  const count = total ?? comp.reduce((s, c, i) => s + (c || 0) + (fail[i] || 0), 0);
  const text = `${num(count)} commands · peak ${num(peak, peak < 10 ? 1 : 0)}/s`;
  const label = svg('text', { x: X(t0) + 4, y: y + 10, class: 'tl-note tl-dens-label' }, text);
  const el = svg('g', { class: 'tl-density', 'data-testid': 'timeline-density', 'data-total': count },
    svg('title', null, `${text} (columns: commands finished per ${secs(w)}; failed on top)`),
    svg('line', { class: 'tl-dens-base', x1: X(t0), x2: X(t0 + comp.length * w), y1: base + 0.5, y2: base + 0.5 }),
    pc ? svg('path', { class: 'tl-dens-ok', d: pc }) : null,
    pf ? svg('path', { class: 'tl-dens-fail', d: pf }) : null,
    label);
  return { el, label };
}

function lane(st, y, X, t0, t1) {
  const name = String(st.step ?? '?');
  const runs = Array.isArray(st.runs) ? st.runs : [];
  const cmds = Array.isArray(st.commands) ? st.commands : null;
  const dens = !cmds && st.density && Array.isArray(st.density.completed) ? st.density : null;
  const parts = [];
  const stick = [];
  let yy = y + LANE_PAD;
  runs.forEach((r, i) => {
    const status = r.status || (r.ended == null ? 'running' : 'completed');
    const a = X(r.started);
    parts.push(svg('rect', {
      class: `tl-run ${statusClass(status)}`, 'data-testid': 'timeline-run', 'data-status': status,
      x: f1(a), y: yy + (ROW_H - RUN_H) / 2, width: f1(Math.max(2, X(r.ended ?? t1) - a)), height: RUN_H, rx: 2,
    }, svg('title', null, `${name} run ${i + 1}: ${secs((r.ended ?? t1) - r.started)} (${status})`)));
  });
  yy += ROW_H;
  let note = '';
  if (cmds && cmds.length) {
    const items = cmds.map((c) => ({ c, a: c.started ?? c.issued ?? t0, b: c.ended ?? t1 }));
    const { count, overflow } = pack(items);
    yy += 2;
    for (const { c, a, b, lane: k } of items) {
      const status = c.status || 'issued';
      const attempt = Number(c.attempt) || 1;
      const xa = X(a);
      const cls = `tl-cmd ${statusClass(status)}${c.started == null ? ' waiting' : ''}${attempt > 1 ? ' retry' : ''}`;
      const tries = Array.isArray(c.tries) ? c.tries : [];
      const retries = tries.filter((t) => Number(t.attempt) > 1).length;
      const what = `${c.loop_index != null ? `#${c.loop_index} ` : ''}attempt ${attempt}`;
      const cy = yy + k * (SUB_H + SUB_GAP);
      if (retries) {
        // A command whose task was retried: each try its own bar (retries outlined), the
        // backoff between them a gap with a thin line.
        parts.push(svg('line', {
          class: 'tl-backoff', x1: f1(xa), x2: f1(Math.max(xa + 1.5, X(b))), y1: cy + SUB_H / 2, y2: cy + SUB_H / 2,
        }));
        tries.forEach((t, j) => {
          const ta = X(t.started);
          const tstatus = t.status || 'completed';
          const wait = j ? Number(t.started) - Number(tries[j - 1].ended) : 0;
          parts.push(svg('rect', {
            class: `tl-cmd tl-try ${statusClass(tstatus)}${Number(t.attempt) > 1 ? ' retry' : ''}`,
            'data-testid': 'timeline-try', 'data-status': tstatus, 'data-attempt': Number(t.attempt) || 1,
            x: f1(ta), y: cy - 1, width: f1(Math.max(4, X(t.ended) - ta)), height: SUB_H + 2,
          }, svg('title', null, `${what}, ${t.task ?? 'task'} try ${Number(t.attempt) || 1}:`
            + ` ${secs(Number(t.ended) - Number(t.started))} (${tstatus})${j ? `, after a ${secs(wait)} backoff` : ''}`)));
        });
        continue;
      }
      parts.push(svg('rect', {
        class: cls, 'data-testid': 'timeline-command', 'data-status': status, 'data-attempt': attempt,
        x: f1(xa), y: cy, width: f1(Math.max(1.5, X(b) - xa)), height: SUB_H,
      }, svg('title', null, `${what}: ${secs(b - a)} (${status})`)));
    }
    yy += count * (SUB_H + SUB_GAP) + 2;
    note = `${num(cmds.length)} command${cmds.length === 1 ? '' : 's'}${overflow ? ' (overlapping)' : ''}`;
  }
  if (dens) {
    const d = densityLane(dens, st.total_commands, yy, X, t0);
    parts.push(d.el);
    stick.push(d.label);
    yy += DENS_H;
  }
  const height = Math.max(yy + LANE_PAD - y, 34);
  const label = svg('g', { class: 'tl-label' },
    svg('title', null, name),
    svg('rect', { class: 'tl-label-bg', x: 0, y, width: LABEL_W, height: height - 1 }),
    svg('line', { class: 'tl-sep', x1: LABEL_W - 0.5, x2: LABEL_W - 0.5, y1: y, y2: y + height }),
    svg('text', { class: 'tl-step', x: 10, y: y + LANE_PAD + 13 }, truncate(name, 19)),
    note ? svg('text', { class: 'tl-note', x: 10, y: y + LANE_PAD + 27 }, note) : null);
  stick.push(label);
  const el = svg('g', { class: 'tl-lane', 'data-testid': 'timeline-lane', 'data-step': name },
    svg('line', { class: 'tl-sep', x1: 0, x2: '100%', y1: y + height - 0.5, y2: y + height - 0.5 }), parts, label);
  return { el, stick, height };
}

/** timelineView(executionId) → {el, start(), stop(), destroy()}; start() when the tab shows. */
export function timelineView(id) {
  let data = null;
  let zoom = 1;
  let dead = false;
  let scale = null; // {x0, pps, t0} of the last render, to keep the centre when zooming
  let stickies = [];
  let lastWidth = 0;

  const zoomLabel = h('span', { class: 'muted zoom-label', 'data-testid': 'timeline-zoom' });
  const zoomBtn = (label, name, fn) => h('button', { type: 'button', class: 'small', 'aria-label': name, onclick: fn }, label);
  const outBtn = zoomBtn('−', 'Zoom out', () => setZoom(zoom / 2));
  const inBtn = zoomBtn('+', 'Zoom in', () => setZoom(zoom * 2));
  const box = h('div', { class: 'timeline-scroll' }, h('p', { class: 'muted pad' }, 'Loading timeline…'));
  const el = h('div', null,
    h('div', { class: 'graph-tools' },
      outBtn, zoomLabel, inBtn, zoomBtn('Fit', 'Fit to width', () => setZoom(1)),
      h('span', { class: 'spacer' }),
      h('span', { class: 'muted small' }, 'outlined: retry (the gap before it: its backoff) · faded: waiting to start'),
      h('span', { class: 'legend' }, LEGEND.map((s) => h('span', { class: `swatch ${statusClass(s)}` }, s)))),
    box);

  const placeStickies = () => {
    const t = `translate(${box.scrollLeft},0)`;
    for (const n of stickies) n.setAttribute('transform', t);
  };
  box.addEventListener('scroll', placeStickies, { passive: true });
  const resize = typeof ResizeObserver === 'function'
    ? new ResizeObserver(() => { if (data && box.clientWidth && box.clientWidth !== lastWidth) render(); })
    : null;
  if (resize) resize.observe(box);

  function showZoom() {
    zoomLabel.textContent = zoom === 1 ? 'Fit' : `×${zoom}`;
    outBtn.disabled = zoom <= 1;
    inBtn.disabled = zoom >= MAX_ZOOM;
  }

  function setZoom(z) {
    const next = Math.min(MAX_ZOOM, Math.max(1, z));
    const anchor = scale && box.clientWidth
      ? scale.t0 + (box.scrollLeft + box.clientWidth / 2 - scale.x0) / scale.pps : null;
    zoom = next;
    showZoom();
    render(zoom === 1 ? null : anchor);
  }

  function render(anchor = null) {
    const avail = box.clientWidth;
    if (!data || !avail) return; // hidden: drawn when shown
    lastWidth = avail;
    const steps = Array.isArray(data.steps) ? data.steps : [];
    if (!steps.length) {
      scale = null;
      stickies = [];
      box.replaceChildren(h('p', { class: 'muted pad', 'data-testid': 'timeline-empty' }, 'No steps have run yet.'));
      return;
    }
    const t0 = Number(data.start) || 0;
    const t1 = Math.max(Number(data.end) || t0, t0);
    const span = Math.max(t1 - t0, 0.001);
    const x0 = LABEL_W + PAD_L;
    const pps = ((Math.max(MIN_W, avail) - x0 - PAD_R) / span) * zoom;
    const width = Math.floor(x0 + span * pps + PAD_R);
    const X = (t) => x0 + (Number.isFinite(Number(t)) ? Math.min(Math.max(Number(t), t0), t1) - t0 : 0) * pps;

    const atRight = box.scrollLeft > 0 && box.scrollLeft + box.clientWidth >= box.scrollWidth - 2;
    const top = box.scrollTop;
    let left = box.scrollLeft;
    if (anchor != null) left = x0 + (anchor - t0) * pps - avail / 2;

    let y = AXIS_H;
    stickies = [];
    const lanes = steps.map((st) => {
      const l = lane(st, y, X, t0, t1);
      y += l.height;
      stickies.push(...l.stick);
      return l.el;
    });
    const height = y + 4;
    const step = tickStep(span, pps);
    const grid = svg('g', { class: 'tl-grid' });
    const axis = svg('g', { class: 'tl-axis' });
    for (let i = 0; i * step <= span * (1 + 1e-9); i += 1) {
      const x = f1(x0 + i * step * pps);
      grid.append(svg('line', { x1: x, x2: x, y1: AXIS_H - 4, y2: height }));
      axis.append(svg('text', { x, y: 15, 'text-anchor': i ? 'middle' : 'start' }, tickLabel(i * step)));
    }
    const running = !STOPPED.has(data.status);
    const xe = f1(X(t1));
    const endLine = svg('line', { class: 'tl-end', x1: xe, x2: xe, y1: AXIS_H - 6, y2: height },
      svg('title', null, `${running ? 'now' : 'end'}: ${tickLabel(span)}`));
    const corner = svg('g', { class: 'tl-corner' },
      svg('rect', { x: 0, y: 0, width: LABEL_W, height: AXIS_H }),
      svg('text', { class: 'tl-note', x: 10, y: 15 }, running ? 'running…' : data.status || ''));
    stickies.push(corner);
    const root = svg('svg', {
      class: 'tl', 'data-testid': 'timeline', 'data-status': data.status || '', width, height,
      viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': `Timeline of ${steps.length} steps`,
    }, grid, endLine, lanes, axis, corner);

    box.replaceChildren(root);
    box.scrollTop = top;
    box.scrollLeft = atRight && anchor == null ? box.scrollWidth : Math.max(0, left);
    placeStickies();
    scale = { x0, pps, t0 };
  }

  async function load() {
    try {
      const d = await api(`/api/executions/${enc(id)}/timeline?buckets=120`);
      if (dead) return false;
      data = d || { steps: [] };
      render();
      return !TERMINAL.has(data.status);
    } catch (err) {
      if (dead || err.status === 401) return false;
      if (err.status === 404) {
        box.replaceChildren(h('p', { class: 'muted pad' }, `No timeline: ${err.message}`));
        return false;
      }
      message(`Could not load the timeline: ${err.message}`);
      return true;
    }
  }

  const poller = new Poller(load, 2000);
  showZoom();

  return {
    el,
    start() {
      if (dead) return;
      render();
      if (poller.stopped && !(data && TERMINAL.has(data.status))) poller.start();
    },
    stop() { poller.stop(); },
    destroy() {
      dead = true;
      poller.stop();
      if (resize) resize.disconnect();
    },
  };
}
