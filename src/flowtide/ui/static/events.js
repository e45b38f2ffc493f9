// An execution's event log: fetched page by page (500 per request) and then polled while
// the execution runs; shown 200 rows at a time so a very long log stays responsive.
import { api, enc } from './api.js';
import { h, setText, clockTime, absTime, message, sleep } from './util.js';

const LIMIT = 500;
export const PAGE = 200;

export class EventLog {
  /** isTerminal() tells whether the execution has finished (from the summary). */
  constructor(executionId, isTerminal) {
    this.id = executionId;
    this.isTerminal = isTerminal;
    this.events = [];
    this.byStep = new Map();
    this.types = new Map(); // type -> count, in the order first seen
    this.after = null;
    this.started = false;
    this.dead = false;
    this.caughtUp = false; // the last page came back short
    this.finished = false; // terminal and fully read: no more polling
    this.subs = new Set();
  }

  subscribe(fn) {
    this.subs.add(fn);
    return () => this.subs.delete(fn);
  }

  emit() {
    for (const fn of this.subs) fn();
  }

  start() {
    if (this.started || this.dead) return;
    this.started = true;
    this.run();
  }

  stop() {
    this.dead = true;
    this.subs.clear();
  }

  ingest(page) {
    for (const ev of page) {
      this.events.push(ev);
      const type = ev.type ?? '?';
      this.types.set(type, (this.types.get(type) || 0) + 1);
      if (ev.step != null) {
        if (!this.byStep.has(ev.step)) this.byStep.set(ev.step, []);
        this.byStep.get(ev.step).push(ev);
      }
    }
    if (page.length) this.after = String(page[page.length - 1].event_id);
  }

  async run() {
    while (!this.dead) {
      const terminalBefore = this.isTerminal();
      let page;
      try {
        const after = this.after != null ? `&after=${enc(this.after)}` : '';
        page = await api(`/api/executions/${enc(this.id)}/events?limit=${LIMIT}${after}`);
      } catch (err) {
        if (this.dead || err.status === 401) return;
        message(`Could not load events: ${err.message}`);
        await sleep(3000);
        continue;
      }
      if (this.dead) return;
      if (!Array.isArray(page)) page = [];
      this.ingest(page);
      const full = page.length >= LIMIT;
      if (!full) {
        this.caughtUp = true;
        if (terminalBefore) this.finished = true;
      }
      if (page.length || !full) this.emit();
      if (full) continue;
      if (this.finished) return;
      await sleep(1000);
    }
  }
}

/** A row (plus its JSON row when expanded) for an event; clicking toggles the JSON. */
export function eventRows(ev, expanded, { compact = false } = {}) {
  const id = String(ev.event_id);
  const cells = compact
    ? [clockTime(ev.time), ev.type, ev.status]
    : [clockTime(ev.time), ev.type, ev.step, ev.status, ev.command_id, ev.worker_id];
  const tr = h('tr', {
    class: 'ev', tabindex: 0, 'data-testid': compact ? 'step-event-row' : 'event-row',
    'data-type': ev.type ?? '', 'aria-expanded': String(expanded.has(id)),
  }, cells.map((c, i) => h('td', { class: i === 0 || i >= 4 ? 'mono nowrap' : null }, c ?? '')));
  tr.firstChild.title = absTime(ev.time);
  let detail = null;
  const makeDetail = () => h('tr', { class: 'ev-json' },
    h('td', { colspan: cells.length }, h('pre', { class: 'json' }, JSON.stringify(ev, null, 2))));
  const toggle = () => {
    if (detail) {
      detail.remove();
      detail = null;
      expanded.delete(id);
    } else {
      detail = makeDetail();
      tr.after(detail);
      expanded.add(id);
    }
    tr.setAttribute('aria-expanded', String(Boolean(detail)));
  };
  tr.addEventListener('click', (e) => {
    if (e.target instanceof Element && e.target.closest('a')) return;
    toggle();
  });
  tr.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' || e.key === ' ') {
      e.preventDefault();
      toggle();
    }
  });
  if (expanded.has(id)) detail = makeDetail();
  return detail ? [tr, detail] : [tr];
}

/** The Events tab: type chips, the table and its pager. */
export function eventsView(log) {
  const active = new Set(); // chosen types; none means all
  const expanded = new Set();
  let filtered = [];
  let seen = 0;
  let page = 0;
  let shownKey = '';

  const chips = h('div', { class: 'chips', role: 'group', 'aria-label': 'Filter by event type' });
  const chipRefs = new Map();
  const clearChip = h('button', {
    type: 'button', class: 'chip clear', hidden: true, onclick: () => { active.clear(); refilter(); },
  }, 'Show all');
  chips.append(clearChip);
  const state = h('span', { class: 'muted live' });
  const info = h('span', { class: 'muted' });
  const mk = (label, fn, testid) => {
    const b = h('button', { type: 'button', 'data-testid': testid }, label);
    b.addEventListener('click', () => { fn(); render(); });
    return b;
  };
  const pages = () => Math.max(1, Math.ceil(filtered.length / PAGE));
  const first = mk('« First', () => { page = 0; }, 'events-first');
  const prev = mk('‹ Prev', () => { page = Math.max(0, page - 1); }, 'events-prev');
  const next = mk('Next ›', () => { page = Math.min(pages() - 1, page + 1); }, 'events-next');
  const last = mk('Last »', () => { page = pages() - 1; }, 'events-last');
  const tbody = h('tbody');
  const table = h('table', { class: 'grid events-table', 'data-testid': 'events-table' },
    h('thead', null, h('tr', null, ['Time', 'Type', 'Step', 'Status', 'Command', 'Worker'].map((t) => h('th', null, t)))),
    tbody);
  const el = h('div', { class: 'events-view' }, chips,
    h('div', { class: 'pager' }, first, prev, info, next, last, h('span', { class: 'spacer' }), state),
    h('div', { class: 'table-wrap' }, table));

  const match = (ev) => active.size === 0 || active.has(ev.type ?? '?');
  function ingest() {
    const evs = log.events;
    for (; seen < evs.length; seen++) if (match(evs[seen])) filtered.push(evs[seen]);
  }
  function refilter() {
    filtered = [];
    seen = 0;
    page = 0;
    render(true);
  }

  function chipsUpdate() {
    for (const [type, n] of log.types) {
      let ref = chipRefs.get(type);
      if (!ref) {
        const countEl = h('span', { class: 'chip-count' });
        const b = h('button', { type: 'button', class: 'chip', 'data-testid': 'event-type-chip', 'data-type': type }, type, ' ', countEl);
        b.addEventListener('click', () => {
          if (active.has(type)) active.delete(type); else active.add(type);
          refilter();
        });
        ref = { b, countEl };
        chipRefs.set(type, ref);
        chips.insertBefore(b, clearChip);
      }
      setText(ref.countEl, n);
      ref.b.setAttribute('aria-pressed', String(active.has(type)));
    }
    clearChip.hidden = active.size === 0;
  }

  function render(force = false) {
    ingest();
    chipsUpdate();
    const count = pages();
    if (page >= count) page = count - 1;
    const start = page * PAGE;
    const slice = filtered.slice(start, start + PAGE);
    const key = `${start}|${slice.length}|${slice.length ? slice[0].event_id : ''}|${log.caughtUp}`;
    if (force || key !== shownKey) {
      shownKey = key;
      const rows = slice.flatMap((ev) => eventRows(ev, expanded));
      if (!rows.length) {
        rows.push(h('tr', { class: 'empty-row' }, h('td', { colspan: 6 },
          log.caughtUp ? 'No events.' : 'Loading events…')));
      }
      tbody.replaceChildren(...rows);
    }
    const total = log.events.length;
    setText(info, filtered.length
      ? `${start + 1}–${start + slice.length} of ${filtered.length}${active.size ? ` (of ${total})` : ''} · page ${page + 1}/${count}`
      : `0 of ${total}`);
    first.disabled = prev.disabled = page === 0;
    next.disabled = last.disabled = page >= count - 1;
    setText(state, log.finished ? 'complete' : log.caughtUp ? '● live' : 'loading…');
  }

  const unsubscribe = log.subscribe(() => render());
  render(true);
  return { el, render, destroy: unsubscribe };
}
