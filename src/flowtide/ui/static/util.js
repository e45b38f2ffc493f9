// Small helpers shared by the views: DOM building (text only, never HTML from data),
// formatting of times and durations, status badges, the message banner and a poller.

export const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
// Statuses whose clock has stopped: the ended ones and `interrupted` (an embedded run whose
// process went away; it may be resumed, so its page keeps polling).
export const STOPPED = new Set([...TERMINAL, 'interrupted']);
const SVG_NS = 'http://www.w3.org/2000/svg';

function build(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value == null || value === false) continue;
    if (key === 'text') node.textContent = String(value);
    else if (key.startsWith('on') && typeof value === 'function') {
      node.addEventListener(key.slice(2).toLowerCase(), value);
    } else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** An HTML element: h('a', {href, class}, 'text', otherNode). Strings become text nodes. */
export const h = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
/** An SVG element, same conventions as h(). */
export const svg = (tag, attrs, ...children) =>
  build(document.createElementNS(SVG_NS, tag), attrs, children);

/** Replaces a node's children (nulls skipped, strings as text). */
export const fill = (node, ...children) => {
  node.replaceChildren();
  return build(node, null, children);
};

/** Sets a node's text only when it changed (keeps layout work low on refreshes). */
export function setText(node, text) {
  const value = String(text ?? '');
  if (node.textContent !== value) node.textContent = value;
}

export function relTime(ts, now = Date.now() / 1000) {
  if (ts == null || !Number.isFinite(Number(ts))) return '—';
  const diff = now - ts;
  const a = Math.abs(diff);
  if (a < 5) return 'just now';
  let s;
  if (a < 60) s = `${Math.round(a)} s`;
  else if (a < 3600) s = `${Math.floor(a / 60)} min`;
  else if (a < 86400) s = `${Math.floor(a / 3600)} h`;
  else s = `${Math.floor(a / 86400)} d`;
  return diff >= 0 ? `${s} ago` : `in ${s}`;
}

export const absTime = (ts) => (ts == null ? '' : new Date(ts * 1000).toLocaleString());

/** Local wall-clock time with milliseconds, for event logs. */
export function clockTime(ts) {
  if (ts == null) return '';
  const d = new Date(ts * 1000);
  return `${d.toLocaleTimeString([], { hour12: false })}.${String(d.getMilliseconds()).padStart(3, '0')}`;
}

export function duration(sec) {
  if (sec == null || !Number.isFinite(sec) || sec < 0) return '—';
  if (sec < 1) return `${Math.round(sec * 1000)} ms`;
  if (sec < 60) return `${sec.toFixed(sec < 10 ? 2 : 1)} s`;
  const m = Math.floor(sec / 60);
  const pad = (n) => String(n).padStart(2, '0');
  if (sec < 3600) return `${m}m ${pad(Math.floor(sec % 60))}s`;
  const hr = Math.floor(sec / 3600);
  if (sec < 86400) return `${hr}h ${pad(m % 60)}m`;
  return `${Math.floor(sec / 86400)}d ${hr % 24}h`;
}

export const statusClass = (status) =>
  `st-${String(status || 'unknown').toLowerCase().replace(/[^a-z0-9_-]/g, '')}`;

export function badge(status, attrs = {}) {
  return h('span', { class: `badge ${statusClass(status)}`, 'data-status': status ?? '', ...attrs },
    status || 'unknown');
}

/** Updates a badge made by badge() in place. */
export function setBadge(node, status) {
  node.className = `badge ${statusClass(status)}`;
  node.dataset.status = status ?? '';
  setText(node, status || 'unknown');
}

export const execPath = (id) => `/ui/executions/${encodeURIComponent(id)}`;
export const execLink = (id, attrs = {}) =>
  h('a', { href: execPath(id), class: 'mono', ...attrs }, String(id));

export const truncate = (text, n) => {
  const s = String(text ?? '');
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
};

let messageTimer = null;
/** Shows a banner (kind: 'error' | 'info'); it hides itself after a while. */
export function message(text, kind = 'error') {
  const box = document.getElementById('message');
  if (!box) return;
  clearTimeout(messageTimer);
  const close = h('button', { type: 'button', class: 'message-close', 'aria-label': 'Dismiss' }, '×');
  close.addEventListener('click', () => { box.hidden = true; });
  box.replaceChildren(h('span', { class: 'message-text' }, text), close);
  box.className = kind === 'error' ? 'message error' : 'message info';
  box.dataset.kind = kind === 'error' ? 'error' : 'info';
  box.hidden = false;
  messageTimer = setTimeout(() => { box.hidden = true; }, kind === 'error' ? 12000 : 6000);
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Calls fn, waits ms after it settles, calls it again; never two calls at once. fn returning
 * false stops it. While the document is hidden it parks and resumes when visible again.
 */
export class Poller {
  constructor(fn, ms) {
    Object.assign(this, { fn, ms, timer: null, stopped: true, busy: false, again: false, parked: false });
    this.onVisible = () => {
      if (!document.hidden && this.parked && !this.stopped) { this.parked = false; this.kick(); }
    };
  }

  start() {
    this.stopped = false;
    document.addEventListener('visibilitychange', this.onVisible);
    this.kick();
    return this;
  }

  /** Runs now (or right after the call in flight). */
  kick() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    if (this.busy) this.again = true;
    else this.tick();
  }

  async tick() {
    if (this.stopped) return;
    if (document.hidden) { this.parked = true; return; }
    this.busy = true;
    let more = true;
    try { more = (await this.fn()) !== false; } catch (err) { console.error(err); }
    this.busy = false;
    if (this.stopped) return;
    if (!more) { this.stop(); return; }
    if (this.again) { this.again = false; this.tick(); return; }
    this.timer = setTimeout(() => this.tick(), this.ms);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    document.removeEventListener('visibilitychange', this.onVisible);
  }
}
