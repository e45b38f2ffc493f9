// An execution's event log, opened at its end: the newest page (500 events,
// `/events?newest=true&limit=500`), then followed live over the server's SSE stream from
// the highest id read (`/events/stream?after=`, parsed from a fetch() body: its events are
// named, so EventSource.onmessage would see none), with reconnects after a short backoff
// and, after repeated failures, polling of `/events?after=`. A long log is never read from
// its start: older pages are read when asked for (`&before=` the oldest event held). At
// most KEEP events are held; the table shows 200 rows per page.
import { api, enc, openStream } from './api.js';
import { h, setText, clockTime, absTime, message, sleep } from './util.js';

const LIMIT = 500;
export const PAGE = 200;
/** Events held in memory: following the end drops the oldest, loading older the newest. */
export const KEEP = 5000;
const EMIT_MS = 200;
const POLL_MS = 1000;
/** Failed connects in a row after which the stream is given up for polling. */
const STREAM_TRIES = 4;
const BACKOFF_MS = [500, 1000, 2000, 4000];

/** Whether event id a (decimal digits, maybe past 2^53) is after id b. */
export function idAfter(a, b) {
  const x = String(a);
  const y = String(b);
  return x.length !== y.length ? x.length > y.length : x > y;
}

/** Splits SSE text into messages: feed(chunk) → [{event, data, id}] complete so far. */
export class SseParser {
  constructor() {
    this.buf = '';
    this.reset();
  }

  reset() {
    this.event = '';
    this.data = [];
    this.id = null;
  }

  feed(chunk) {
    this.buf += chunk;
    const out = [];
    let at = 0;
    const buf = this.buf;
    for (;;) {
      let nl = -1;
      for (let i = at; i < buf.length; i++) {
        const c = buf.charCodeAt(i);
        if (c === 10 || c === 13) { nl = i; break; }
      }
      if (nl < 0) break;
      // A CR at the very end may be the first half of a CRLF: wait for the next chunk.
      if (buf.charCodeAt(nl) === 13 && nl === buf.length - 1) break;
      const line = buf.slice(at, nl);
      at = nl + (buf.charCodeAt(nl) === 13 && buf.charCodeAt(nl + 1) === 10 ? 2 : 1);
      this.line(line, out);
    }
    this.buf = buf.slice(at);
    return out;
  }

  line(line, out) {
    if (line === '') {
      if (this.data.length || this.event) {
        out.push({ event: this.event || 'message', data: this.data.join('\n'), id: this.id });
      }
      this.reset();
      return;
    }
    if (line.startsWith(':')) return; // a comment (keepalive)
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.event = value;
    else if (field === 'data') this.data.push(value);
    else if (field === 'id' && !value.includes('\0')) this.id = value;
    // `retry:` and unknown fields are ignored: the backoff here is our own.
  }
}

export class EventLog {
  /** isTerminal() tells whether the execution has finished (from the summary). */
  constructor(executionId, isTerminal) {
    this.id = executionId;
    this.isTerminal = isTerminal;
    // The events held: a run of the log without gaps, oldest first, at most KEEP of them.
    this.events = [];
    this.base = 0; // the position of events[0]: lower when older ones are put in front
    this.gen = 0; // bumped when the events are replaced (a jump back to the newest)
    this.types = new Map(); // type -> count among the events held, in the order first seen
    this.hasOlder = false; // the log has events before events[0] that are not held
    this.tail = true; // the events held reach the newest one read (new ones are added)
    this.newer = 0; // events after the last one held that are not held (when !tail)
    this.pending = null; // events read while the newest page is fetched again
    this.busy = null; // null | 'older' | 'newest': a page being fetched for the user
    this.after = null; // the highest event id seen: where a stream or page continues
    this.recent = new Set(); // ids of the newest KEEP events seen (a repeat is skipped)
    this.recentOrder = [];
    this.started = false;
    this.dead = false;
    this.caughtUp = false; // read up to the end of the log once
    this.finished = false; // terminal and read to its end: nothing more comes
    // loading | live (stream) | reconnecting | polling | ended (the stream's end event) | complete
    this.mode = 'idle';
    this.end = null; // the data of the stream's `end` event
    this.controller = null;
    this.emitTimer = null;
    this.subs = new Set();
    this.endSubs = new Set();
  }

  /** Whether the events held are the whole log (as far as it was read). */
  get whole() {
    return !this.hasOlder && this.tail;
  }

  subscribe(fn) {
    this.subs.add(fn);
    return () => this.subs.delete(fn);
  }

  /** fn(end) once the stream says the execution ended ({execution_id, status, error}). */
  onEnd(fn) {
    this.endSubs.add(fn);
    return () => this.endSubs.delete(fn);
  }

  emit() {
    clearTimeout(this.emitTimer);
    this.emitTimer = null;
    for (const fn of this.subs) fn();
  }

  /** Emits within EMIT_MS, once for however many batches arrive meanwhile. */
  emitSoon() {
    if (this.emitTimer == null) this.emitTimer = setTimeout(() => this.emit(), EMIT_MS);
  }

  setMode(mode) {
    if (this.mode === mode) return;
    this.mode = mode;
    this.emit();
  }

  start() {
    if (this.started || this.dead) return;
    this.started = true;
    this.run();
  }

  stop() {
    this.dead = true;
    clearTimeout(this.emitTimer);
    if (this.controller) this.controller.abort();
    this.subs.clear();
    this.endSubs.clear();
  }

  /** Follows the log again after it ended (a resumed execution). */
  revive() {
    if (!this.started || this.dead || !this.finished) return;
    this.finished = false;
    this.end = null;
    this.follow();
  }

  count(ev, n) {
    const type = ev.type ?? '?';
    this.types.set(type, (this.types.get(type) || 0) + n);
  }

  /** Events read from the stream or a page after `after`: added after the events held. */
  ingest(page) {
    if (!page.length) return;
    for (const ev of page) {
      // The same event twice (a reconnect, or `flowtide ui`'s stream re-reading a short
      // window before its position to catch late writes) is kept once.
      if (ev.event_id != null) {
        const key = String(ev.event_id);
        if (this.recent.has(key)) continue;
        this.recent.add(key);
        this.recentOrder.push(key);
        if (this.after == null || idAfter(key, this.after)) this.after = key;
        // Before the first event held while older ones are not: the Older page has it.
        const first = this.events.length ? this.events[0].event_id : null;
        if (this.tail && this.hasOlder && first != null && idAfter(String(first), key)) continue;
      }
      if (this.pending) this.pending.push(ev);
      else if (!this.tail) this.newer += 1;
      else {
        this.events.push(ev);
        this.count(ev, 1);
      }
    }
    // Following the end: the oldest are dropped (not while an older page is on its way).
    const drop = this.events.length - KEEP;
    if (drop > 0 && this.busy !== 'older') this.dropFront(drop);
    if (this.recentOrder.length > 2 * KEEP) {
      for (const key of this.recentOrder.splice(0, this.recentOrder.length - KEEP)) this.recent.delete(key);
    }
  }

  dropFront(n) {
    for (const ev of this.events.splice(0, n)) this.count(ev, -1);
    this.base += n;
    this.hasOlder = true;
  }

  dropBack(n) {
    for (const ev of this.events.splice(this.events.length - n, n)) this.count(ev, -1);
    this.newer += n;
    this.tail = false;
  }

  url(query) {
    return `/api/executions/${enc(this.id)}/events?${query}`;
  }

  /** The newest LIMIT events (or those before event id `before`), in log order. */
  async newest(before = null) {
    const page = await api(this.url(`newest=true&limit=${LIMIT}${before != null ? `&before=${enc(before)}` : ''}`));
    return Array.isArray(page) ? page : [];
  }

  /** Puts the page of events before the oldest held in front: how many were added. */
  async loadOlder() {
    if (this.busy || !this.hasOlder || !this.events.length || this.dead) return 0;
    const first = String(this.events[0].event_id);
    const gen = this.gen;
    this.busy = 'older';
    this.emit();
    let page;
    try {
      page = await this.newest(first);
    } catch (err) {
      if (!this.dead && err.status !== 401) message(`Could not load older events: ${err.message}`);
      page = null;
    } finally {
      this.busy = null;
    }
    if (this.dead) return 0;
    let added = 0;
    if (page && gen === this.gen && this.events.length && String(this.events[0].event_id) === first) {
      const older = page.filter((ev) => ev.event_id == null || idAfter(first, String(ev.event_id)));
      this.events = older.concat(this.events);
      for (const ev of older) this.count(ev, 1);
      this.base -= older.length;
      this.hasOlder = page.length >= LIMIT;
      added = older.length;
      // Over the cap: the newest go (and are read again by loadNewest()).
      if (this.events.length > KEEP) this.dropBack(this.events.length - KEEP);
    } else if (this.events.length > KEEP && this.tail) {
      this.dropFront(this.events.length - KEEP);
    }
    this.emit();
    return added;
  }

  /** Holds the newest page again, and the events after it as they come (after loadOlder()). */
  async loadNewest() {
    if (this.busy || this.tail || this.dead) return;
    this.busy = 'newest';
    this.pending = [];
    this.emit();
    let page = null;
    try {
      page = await this.newest();
    } catch (err) {
      if (!this.dead && err.status !== 401) message(`Could not load the newest events: ${err.message}`);
    } finally {
      this.busy = null;
    }
    const pending = this.pending;
    this.pending = null;
    if (this.dead) return;
    if (!page) {
      this.newer += pending.length;
    } else {
      this.events = [];
      this.types = new Map();
      this.recent = new Set();
      this.recentOrder = [];
      this.base = 0;
      this.gen += 1;
      this.tail = true;
      this.newer = 0;
      this.hasOlder = page.length >= LIMIT;
      this.ingest(page);
      this.ingest(pending);
    }
    this.emit();
  }

  /** One page of /events after the last one seen: true when the log is read to its end. */
  async readPage() {
    const after = this.after != null ? `&after=${enc(this.after)}` : '';
    let page = await api(this.url(`limit=${LIMIT}${after}`));
    if (!Array.isArray(page)) page = [];
    this.ingest(page);
    return page.length < LIMIT;
  }

  /** Polls pages after the newest event seen every POLL_MS (the fallback for the stream). */
  async pages() {
    while (!this.dead) {
      const terminalBefore = this.isTerminal();
      let atEnd;
      try {
        atEnd = await this.readPage();
      } catch (err) {
        if (this.dead || err.status === 401) return;
        message(`Could not load events: ${err.message}`);
        await sleep(3000);
        continue;
      }
      if (this.dead) return;
      if (atEnd && terminalBefore) {
        this.finished = true;
        this.mode = 'complete';
      }
      this.emit();
      if (this.finished) return;
      if (atEnd) await sleep(POLL_MS);
    }
  }

  /** The newest page first (a long log is not read from its start), then the stream. */
  async run() {
    this.mode = 'loading';
    let page = null;
    let terminalBefore = false;
    while (!this.dead && !page) {
      terminalBefore = this.isTerminal();
      try {
        page = await this.newest();
      } catch (err) {
        if (this.dead || err.status === 401) return;
        message(`Could not load events: ${err.message}`);
        await sleep(3000);
      }
    }
    if (this.dead) return;
    this.hasOlder = page.length >= LIMIT;
    this.ingest(page);
    this.caughtUp = true;
    if (terminalBefore) {
      this.finished = true;
      this.mode = 'complete';
    }
    this.emit();
    if (!this.finished) this.follow();
  }

  /** The stream, reconnected after failures; polling once it failed STREAM_TRIES times. */
  async follow() {
    let failures = 0;
    while (!this.dead && !this.finished) {
      const t0 = Date.now();
      const outcome = await this.stream();
      if (this.dead || outcome === 'end' || outcome === 'stop') return;
      // A stream that carried events or stayed up a while was fine: start counting again.
      if (outcome === 'closed' || Date.now() - t0 > 5000) failures = 0;
      failures += 1;
      if (outcome === 'unsupported' || failures >= STREAM_TRIES) break;
      this.setMode('reconnecting');
      await sleep(BACKOFF_MS[Math.min(failures, BACKOFF_MS.length) - 1]);
    }
    if (this.dead || this.finished) return;
    this.setMode('polling');
    await this.pages();
  }

  /** One connection: 'end' | 'closed' (after events) | 'failed' | 'unsupported' | 'stop'. */
  async stream() {
    const controller = new AbortController();
    this.controller = controller;
    const after = this.after != null ? `?after=${enc(this.after)}` : '';
    let res;
    try {
      res = await openStream(`/api/executions/${enc(this.id)}/events/stream${after}`, { signal: controller.signal });
    } catch (err) {
      if (this.dead || err.status === 401) return 'stop';
      // No such route (an older server) or a position it does not know: poll instead.
      return err.status === 404 || err.status === 405 || err.status === 422 ? 'unsupported' : 'failed';
    }
    if (!res.body || !res.body.getReader) return 'unsupported';
    this.setMode('live');
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    const parser = new SseParser();
    let got = false;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (this.dead) return 'stop';
        if (done) break;
        const batch = [];
        let end = null;
        for (const msg of parser.feed(decoder.decode(value, { stream: true }))) {
          if (msg.event === 'end') {
            try { end = JSON.parse(msg.data); } catch { end = {}; }
            break;
          }
          let doc;
          try { doc = JSON.parse(msg.data); } catch { continue; }
          if (doc && typeof doc === 'object') {
            if (doc.event_id == null && msg.id != null) doc.event_id = msg.id;
            batch.push(doc);
          }
        }
        if (batch.length) {
          got = true;
          this.ingest(batch);
          this.emitSoon();
        }
        if (end) {
          this.end = end;
          this.caughtUp = true;
          this.finished = true;
          this.mode = 'ended';
          this.emit();
          for (const fn of this.endSubs) fn(end);
          return 'end';
        }
      }
    } catch {
      if (this.dead) return 'stop';
    } finally {
      controller.abort();
      if (this.controller === controller) this.controller = null;
    }
    return got ? 'closed' : 'failed';
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
    'data-id': id, 'data-type': ev.type ?? '', 'aria-expanded': String(expanded.has(id)),
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

const num = (n) => Number(n).toLocaleString('en-US');
const plural = (n, word) => `${num(n)} ${word}${n === 1 ? '' : 's'}`;

/**
 * The Events tab: type chips, the pager, the bar that loads older (and again the newest)
 * events and the table. It opens on the last page and stays there as events arrive.
 */
export function eventsView(log) {
  const active = new Set(); // chosen types; none means all
  const expanded = new Set();
  let filtered = []; // positions (log.base + i) of the events held that match
  let lo = log.base; // positions [lo, hi) are looked at
  let hi = log.base;
  let gen = log.gen;
  let page = 0;
  let follow = true; // on the last page: stay there as events arrive
  let shownKey = '';

  const chipsScope = h('span', { class: 'muted small chips-scope', 'data-testid': 'events-counts-scope', hidden: true });
  const chips = h('div', { class: 'chips', role: 'group', 'aria-label': 'Filter by event type' }, chipsScope);
  const chipRefs = new Map();
  const clearChip = h('button', {
    type: 'button', class: 'chip clear', hidden: true, onclick: () => { active.clear(); refilter(); },
  }, 'Show all');
  chips.append(clearChip);
  const state = h('span', { class: 'muted live', 'data-testid': 'events-state' });
  const info = h('span', { class: 'muted', 'data-testid': 'events-info' });
  const pages = () => Math.max(1, Math.ceil(filtered.length / PAGE));
  const mk = (label, fn, testid) => {
    const b = h('button', { type: 'button', 'data-testid': testid }, label);
    b.addEventListener('click', () => {
      fn();
      follow = page >= pages() - 1;
      render();
    });
    return b;
  };
  const first = mk('« First', () => { page = 0; }, 'events-first');
  const prev = mk('‹ Prev', () => { page = Math.max(0, page - 1); }, 'events-prev');
  const next = mk('Next ›', () => { page = Math.min(pages() - 1, page + 1); }, 'events-next');
  const last = mk('Last »', () => { page = pages() - 1; }, 'events-last');

  // The window bar: older events (or the start of the log), what the counts cover, and
  // the newer events not held after older ones were loaded.
  const older = h('button', {
    type: 'button', class: 'small', 'data-testid': 'events-older', hidden: true,
    title: `Load the ${LIMIT} events before the oldest one shown`,
  }, '↑ Older events');
  older.addEventListener('click', async () => {
    follow = false;
    const added = await log.loadOlder();
    if (added) page = 0; // the rows just loaded
    render();
  });
  const startNote = h('span', { class: 'muted small', 'data-testid': 'events-start', hidden: true }, 'Start of the log');
  const scope = h('span', { class: 'muted small scope', 'data-testid': 'events-scope' });
  const newerNote = h('span', { class: 'small newer-note', 'data-testid': 'events-newer', hidden: true });
  const newest = h('button', {
    type: 'button', class: 'small', 'data-testid': 'events-newest', hidden: true,
    title: 'Show the newest events again and follow new ones',
  }, 'Newest events ↓');
  newest.addEventListener('click', async () => {
    follow = true;
    await log.loadNewest();
    render();
  });
  const windowBar = h('div', { class: 'events-window', 'data-testid': 'events-window' },
    older, startNote, scope, h('span', { class: 'newer' }, newerNote, newest));

  const tbody = h('tbody');
  const table = h('table', { class: 'grid events-table', 'data-testid': 'events-table' },
    h('thead', null, h('tr', null, ['Time', 'Type', 'Step', 'Status', 'Command', 'Worker'].map((t) => h('th', null, t)))),
    tbody);
  const el = h('div', { class: 'events-view' }, chips,
    h('div', { class: 'pager' }, first, prev, info, next, last, h('span', { class: 'spacer' }), state),
    windowBar,
    h('div', { class: 'table-wrap' }, table));

  const match = (ev) => active.size === 0 || active.has(ev.type ?? '?');
  /** Brings `filtered` in line with the events held (dropped, put in front or added). */
  function ingest() {
    const evs = log.events;
    const from = log.base;
    const to = from + evs.length;
    if (gen !== log.gen) {
      gen = log.gen;
      filtered = [];
      lo = hi = from;
    }
    if (lo < from) { // the oldest were dropped
      let cut = 0;
      while (cut < filtered.length && filtered[cut] < from) cut += 1;
      filtered.splice(0, cut);
      if (!follow) page = Math.max(0, page - Math.floor(cut / PAGE)); // stay near the rows shown
      lo = from;
      if (hi < lo) hi = lo;
    }
    if (hi > to) { // the newest were dropped
      while (filtered.length && filtered[filtered.length - 1] >= to) filtered.pop();
      hi = to;
      if (lo > hi) lo = hi;
    }
    if (from < lo) { // older ones put in front
      const front = [];
      for (let p = from; p < lo; p++) if (match(evs[p - from])) front.push(p);
      filtered = front.concat(filtered);
      lo = from;
    }
    for (; hi < to; hi++) if (match(evs[hi - from])) filtered.push(hi);
  }
  function refilter() {
    filtered = [];
    lo = hi = log.base;
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
    }
    for (const [type, ref] of chipRefs) {
      const n = log.types.get(type) || 0;
      setText(ref.countEl, n);
      ref.b.dataset.count = String(n);
      ref.b.hidden = n === 0 && !active.has(type);
      ref.b.setAttribute('aria-pressed', String(active.has(type)));
    }
    clearChip.hidden = active.size === 0;
  }

  function windowUpdate() {
    const held = log.events.length;
    const whole = log.whole;
    el.dataset.whole = String(whole);
    windowBar.hidden = !log.caughtUp;
    older.hidden = !log.hasOlder || !held;
    older.disabled = log.busy != null;
    setText(older, log.busy === 'older' ? 'Loading older events…' : '↑ Older events');
    startNote.hidden = log.hasOlder || !held || !log.caughtUp;
    newest.hidden = log.tail;
    newest.disabled = log.busy != null;
    setText(newest, log.busy === 'newest' ? 'Loading the newest…' : 'Newest events ↓');
    newerNote.hidden = log.tail;
    setText(newerNote, `${plural(log.newer, 'newer event')} not loaded`);
    let text = '';
    if (log.caughtUp && whole) text = `The whole log${log.finished ? '' : ' so far'}: ${plural(held, 'event')}.`;
    else if (log.caughtUp) {
      const where = log.tail ? 'the newest of the log' : 'a part of the log';
      text = `${plural(held, 'event')} loaded, ${where}: the counts cover these only.`;
      if (held >= KEEP) text += ` At most ${num(KEEP)} are held; “flowtide events ${log.id}” lists them all.`;
    }
    setText(scope, text);
    chipsScope.hidden = whole || !held;
    setText(chipsScope, `In the ${plural(held, 'loaded event')}:`);
    chips.title = whole ? '' : 'Counts of the loaded events only';
  }

  function render(force = false) {
    ingest();
    chipsUpdate();
    windowUpdate();
    const count = pages();
    if (follow || page >= count) page = count - 1;
    const start = page * PAGE;
    const slice = filtered.slice(start, start + PAGE).map((i) => log.events[i - log.base]);
    const key = `${log.gen}|${start}|${slice.length}|${slice.length ? `${slice[0].event_id}|${slice[slice.length - 1].event_id}` : ''}|${log.caughtUp}`;
    if (force || key !== shownKey) {
      shownKey = key;
      const rows = slice.flatMap((ev) => eventRows(ev, expanded));
      if (!rows.length) {
        rows.push(h('tr', { class: 'empty-row' }, h('td', { colspan: 6 },
          log.caughtUp ? 'No events.' : 'Loading events…')));
      }
      tbody.replaceChildren(...rows);
    }
    const held = log.events.length;
    const of = log.whole ? '' : ' loaded';
    setText(info, filtered.length
      ? `${num(start + 1)}–${num(start + slice.length)} of ${num(filtered.length)}${active.size ? ` (of ${num(held)}${of})` : of} · page ${page + 1}/${count}`
      : `0 of ${num(held)}${of}`);
    first.disabled = prev.disabled = page === 0;
    next.disabled = last.disabled = page >= count - 1;
    const end = log.end;
    const [label, tip] = {
      loading: ['loading…', 'Reading the newest events'],
      live: ['● live', 'Following the event stream'],
      reconnecting: ['reconnecting…', 'The stream broke: connecting again'],
      polling: ['● live (polling)', 'The stream failed: polling every second'],
      ended: [`ended${end && end.status ? `: ${end.status}` : ''}`, 'The stream said the execution ended'],
      complete: ['complete', 'A finished execution: nothing more comes'],
    }[log.mode] || ['', ''];
    setText(state, label);
    state.title = tip;
    state.dataset.state = log.mode;
    if (end && end.status) state.dataset.endStatus = end.status;
  }

  const unsubscribe = log.subscribe(() => render());
  render(true);
  return { el, render, destroy: unsubscribe };
}
