// The playbook graph as SVG: node boxes placed by the server's layout (layer = column,
// position = row), arcs as cubic curves, and per-poll updates of statuses and arcs taken.
import { svg, setText, statusClass, duration, truncate } from './util.js';

const W = 180;
const H = 60;
const DX = 230;
const DY = 90;
const PAD = 20;
const BACK_DROP = 36;

function marker(id, cls) {
  return svg('marker', {
    id, class: cls, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 9, markerHeight: 9,
    markerUnits: 'userSpaceOnUse', orient: 'auto-start-reverse',
  }, svg('path', { d: 'M0,0 L10,5 L0,10 z' }));
}

const pairKey = (a, b) => `${a}\u0000${b}`;

/** A label's baseline near y but in the gap between rows, so it does not cover a box. */
function gapY(y) {
  const row = Math.floor((y - PAD) / DY);
  const rel = y - PAD - row * DY;
  if (rel < H) return PAD + row * DY - 6; // inside a row of boxes: the gap above it
  return Math.min(Math.max(y, PAD + row * DY + H + 12), PAD + (row + 1) * DY - 5);
}

/**
 * buildGraph(graph, onSelect) → {el, update(summary), select(name), zoom(factor)}.
 * onSelect(name) is called when a node is clicked or activated with Enter/Space.
 */
export function buildGraph(graph, onSelect) {
  const nodes = Array.isArray(graph.nodes) ? graph.nodes : [];
  const edges = Array.isArray(graph.edges) ? graph.edges : [];
  const place = new Map(nodes.map((n) => [n.name, { x: (n.layer || 0) * DX + PAD, y: (n.position || 0) * DY + PAD }]));
  const maxLayer = nodes.reduce((m, n) => Math.max(m, n.layer || 0), 0);
  const maxPos = nodes.reduce((m, n) => Math.max(m, n.position || 0), 0);
  const width = maxLayer * DX + W + 2 * PAD;
  const height = maxPos * DY + H + 2 * PAD + (edges.some((e) => e.back) ? BACK_DROP + 16 : 0);

  const root = svg('svg', {
    class: 'graph', width, height, viewBox: `0 0 ${width} ${height}`, role: 'group', 'aria-label': 'Playbook graph',
  });
  root.append(svg('defs', null, marker('ft-arrow', 'arrow'), marker('ft-arrow-taken', 'arrow taken')));
  const edgeLayer = svg('g', { class: 'edges' });
  const nodeLayer = svg('g', { class: 'nodes' });
  root.append(edgeLayer, nodeLayer);

  const edgeRefs = [];
  const pairs = new Map();
  for (const e of edges) {
    const a = place.get(e.from);
    const b = place.get(e.to);
    if (!a || !b) continue;
    const key = pairKey(e.from, e.to);
    const dup = pairs.get(key) || 0;
    pairs.set(key, dup + 1);
    let d;
    let mx;
    let my;
    if (e.back) {
      // Loops below: from the source's bottom to the target's bottom.
      const x1 = a.x + W * 0.65;
      const y1 = a.y + H;
      const x2 = b.x + W * 0.35;
      const y2 = b.y + H;
      const yb = Math.max(y1, y2) + BACK_DROP + dup * 8;
      d = `M${x1},${y1} C${x1},${yb} ${x2},${yb} ${x2},${y2}`;
      mx = (x1 + x2) / 2;
      my = (y1 + y2 + 6 * yb) / 8 - 3;
    } else {
      const x1 = a.x + W;
      const y1 = a.y + H / 2;
      const x2 = b.x;
      const y2 = b.y + H / 2;
      const c = Math.max(40, (x2 - x1) / 2);
      d = `M${x1},${y1} C${x1 + c},${y1} ${x2 - c},${y2} ${x2},${y2}`;
      mx = (x1 + x2) / 2;
      my = gapY((y1 + y2) / 2) + dup * 11;
    }
    const title = svg('title');
    const path = svg('path', { d, class: 'edge-path', 'marker-end': 'url(#ft-arrow)' });
    const label = svg('text', { x: mx, y: my, class: 'edge-label', 'text-anchor': 'middle' });
    const g = svg('g', {
      class: `edge${e.back ? ' back' : ''}`, 'data-testid': 'graph-edge',
      'data-from': e.from, 'data-to': e.to, 'data-taken': 'false',
    }, title, path, label);
    edgeLayer.append(g);
    edgeRefs.push({ e, key, g, path, label, title, short: e.when ? truncate(e.when, 32) : '', count: -1 });
  }

  const nodeRefs = new Map();
  let selected = null;
  for (const n of nodes) {
    const { x, y } = place.get(n.name);
    const title = svg('title');
    const runs = svg('text', { x: W - 10, y: 20, class: 'n-runs', 'text-anchor': 'end' });
    const dur = svg('text', { x: W - 10, y: 37, class: 'n-dur', 'text-anchor': 'end' });
    // The kind shares its line with the duration: shorter once a duration is shown.
    const kindText = `${n.kind || 'step'}${n.loop ? ` · loop ${n.loop.mode || ''}` : ''}`;
    const kind = svg('text', { x: 10, y: 37, class: 'n-kind' }, truncate(kindText, 22));
    const loopText = svg('text', { x: 10, y: 50, class: 'n-loop' });
    const barBg = svg('rect', { x: 10, y: 53, width: W - 20, height: 3, rx: 1.5, class: 'n-bar-bg' });
    const bar = svg('rect', { x: 10, y: 53, width: 0, height: 3, rx: 1.5, class: 'n-bar' });
    const loopParts = svg('g', { class: 'n-loopparts hide' }, loopText, barBg, bar);
    const g = svg('g', {
      class: 'node st-pending', 'data-testid': 'graph-node', 'data-step': n.name, 'data-status': 'pending',
      transform: `translate(${x},${y})`, tabindex: 0, role: 'button',
    },
    title,
    svg('rect', { class: 'box', width: W, height: H, rx: 6 }),
    n.entry ? svg('path', { class: 'entry-mark', d: 'M0,21 L6,30 L0,39 z' }) : null,
    svg('text', { x: 10, y: 20, class: 'n-name' }, truncate(n.name, n.kind ? 20 : 24)),
    runs,
    kind,
    dur,
    loopParts);
    g.addEventListener('click', () => onSelect(n.name));
    g.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' || ev.key === ' ') {
        ev.preventDefault();
        onSelect(n.name);
      }
    });
    nodeLayer.append(g);
    nodeRefs.set(n.name, { n, g, title, runs, dur, kind, kindText, loopText, bar, loopParts });
  }

  function update(summary) {
    const steps = (summary && summary.steps) || {};
    const taken = new Map(((summary && summary.taken) || []).map((t) => [pairKey(t.from, t.to), t.count || 0]));
    for (const r of edgeRefs) {
      const count = taken.get(r.key) || 0;
      if (count === r.count) continue;
      r.count = count;
      r.g.dataset.taken = String(count > 0);
      r.g.classList.toggle('taken', count > 0);
      r.path.setAttribute('marker-end', count > 0 ? 'url(#ft-arrow-taken)' : 'url(#ft-arrow)');
      setText(r.label, [r.short, count > 1 ? `×${count}` : ''].filter(Boolean).join('  '));
      const lines = [`${r.e.from} → ${r.e.to}${r.e.mode ? ` (${r.e.mode})` : ''}`];
      if (r.e.when) lines.push(`when: ${r.e.when}`);
      if (r.e.line != null) lines.push(`playbook line ${r.e.line}`);
      lines.push(count ? `taken ${count} time${count === 1 ? '' : 's'}` : 'not taken');
      setText(r.title, lines.join('\n'));
    }
    for (const [name, r] of nodeRefs) {
      const st = steps[name] || { status: 'pending', runs: 0 };
      const status = st.status || 'pending';
      r.g.dataset.status = status;
      r.g.setAttribute('class', `node ${statusClass(status)}${name === selected ? ' selected' : ''}`);
      r.g.setAttribute('aria-label', `Step ${name}, ${r.n.kind || 'step'}, ${status}`);
      setText(r.runs, st.runs > 1 ? `×${st.runs}` : '');
      setText(r.dur, st.duration != null ? duration(st.duration) : '');
      setText(r.kind, truncate(r.kindText, st.duration != null ? 16 : 22));
      const loop = st.loop;
      r.loopParts.classList.toggle('hide', !loop);
      if (loop) {
        const total = loop.total ?? 0;
        let text = loop.cursor && !total ? `${loop.done} done` : `${loop.done}/${total}`;
        if (loop.failed) text += ` · ${loop.failed} failed`;
        if (loop.in_flight) text += ` · ${loop.in_flight} active`;
        setText(r.loopText, text);
        r.bar.setAttribute('width', String(total > 0 ? Math.min(1, loop.done / total) * (W - 20) : 0));
        r.bar.classList.toggle('has-failed', loop.failed > 0);
      }
      const tip = [`${name} (${r.n.kind || 'step'}) — ${status}`];
      if (r.n.desc) tip.push(r.n.desc);
      if (st.error && st.error.message) tip.push(`error: ${st.error.message}`);
      setText(r.title, tip.join('\n'));
    }
  }

  function select(name) {
    selected = name;
    for (const [n, r] of nodeRefs) r.g.classList.toggle('selected', n === name);
  }

  function zoom(factor) {
    root.setAttribute('width', String(Math.round(width * factor)));
    root.setAttribute('height', String(Math.round(height * factor)));
  }

  return { el: root, update, select, zoom, nodes: new Map(nodes.map((n) => [n.name, n])) };
}
