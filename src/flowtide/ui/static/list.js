// The executions list: status tabs, server-side filters (playbook text, time range, minimum
// duration, parent; all in the URL so a view can be shared), a keyboard-driven table with
// a progress bar per run, refreshed every 2 s (page 1 only), keyset paging to older
// executions and cancelling a selection.
import { api, enc } from './api.js';
import {
  h, fill, badge, setText, relTime, absTime, duration, execLink, execPath, message, statusClass, Poller,
  TERMINAL,
} from './util.js';

const TABS = [
  ['all', 'All'], ['running', 'Running'], ['interrupted', 'Interrupted'], ['completed', 'Completed'],
  ['failed', 'Failed'], ['cancelled', 'Cancelled'],
];
// An interrupted run (its process went away) is closed as cancelled, nothing run.
const CANCELLABLE = new Set(['running', 'pending', 'interrupted']);
/** Time ranges: URL value, label, seconds back from now (sent as `since`). */
const RANGES = [['', 'Any time', 0], ['1h', 'Last hour', 3600], ['24h', 'Last 24 h', 86400], ['7d', 'Last 7 days', 7 * 86400]];
/** Minimum durations: URL and API value (`min_seconds`), label. */
const MIN_DURATIONS = [['', 'Any duration'], ['1', 'Over 1 s'], ['60', 'Over 1 min'], ['600', 'Over 10 min']];
const TYPE_DELAY_MS = 300;
// What started a run: anything, or one kind of trigger (`?trigger=` of the API).
const TRIGGERS = [['', 'Any start'], ['schedule', 'By a schedule'], ['hook', 'By a webhook'], ['subscription', 'By a subscription']];

function readParams() {
  const q = new URLSearchParams(location.search);
  const pick = (name, allowed) => {
    const v = q.get(name) || '';
    return allowed.some(([key]) => key === v) ? v : '';
  };
  return {
    status: q.get('status') || '',
    // `q` is what older links call the playbook filter.
    playbook: q.get('playbook') || q.get('q') || '',
    range: pick('range', RANGES),
    min_seconds: pick('min_seconds', MIN_DURATIONS),
    parent: /^\d+$/.test(q.get('parent') || '') ? q.get('parent') : '',
    trigger: pick('trigger', TRIGGERS),
    before: q.get('before') || '',
  };
}

/** What started a run, when a trigger did: "by schedule nightly" (a link to the schedule). */
export function triggerBadge(trigger) {
  if (!trigger || !trigger.kind) return null;
  const label = `${trigger.kind} ${trigger.name}`;
  const title = `Started by ${trigger.kind} ${trigger.name}: ${Object.entries(trigger)
    .filter(([k]) => k !== 'kind' && k !== 'name').map(([k, v]) => `${k} ${v}`).join(', ')}`;
  const attrs = { class: 'trigger-badge', 'data-testid': 'trigger-badge', title };
  const pages = {
    schedule: `/ui/schedules/${encodeURIComponent(trigger.name)}`, hook: '/ui/hooks', subscription: '/ui/subscriptions',
  };
  const href = pages[trigger.kind];
  return href ? h('a', { ...attrs, href }, `by ${label}`) : h('span', attrs, `by ${label}`);
}

/** The progress of a list item: {done, total, iter, failed}, or null when unknown. */
function progressOf(it) {
  const p = it.progress;
  if (!p || typeof p !== 'object') return null;
  const iter = Number(p.iterations) > 0;
  const done = Number((iter ? p.iterations_done : p.steps_finished) || 0);
  const total = Number((iter ? p.iterations : p.steps) || 0);
  return { done, total, iter, failed: Number(p.iterations_failed || 0), steps: p.steps, stepsDone: p.steps_finished };
}

export function mountList(root, ctx) {
  let params = readParams();
  let items = [];
  let nextBefore = null;
  let shards = [];
  let loaded = false;
  let dead = false;
  let seq = 0;
  let poller = null;
  let cursor = null; // highlighted row's id
  const selected = new Set();
  const rows = new Map(); // id -> {id, tr, check, cells, sig}

  const tabButtons = TABS.map(([key, label]) => [key, h('button', {
    type: 'button', role: 'tab', class: 'tab', 'data-testid': `status-tab-${key}`,
    onclick: () => go({ status: key === 'all' ? '' : key, before: '' }),
  }, label)]);
  const filter = h('input', {
    type: 'search', class: 'filter', 'data-testid': 'filter-input', placeholder: 'Filter by playbook   /',
    'aria-label': 'Filter executions by playbook path or file', autocomplete: 'off', spellcheck: 'false',
  });
  let typing = null;
  filter.addEventListener('input', () => {
    clearTimeout(typing);
    const value = filter.value.trim();
    typing = setTimeout(() => go({ playbook: value, before: '' }, true), TYPE_DELAY_MS);
  });
  filter.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter') {
      clearTimeout(typing);
      go({ playbook: filter.value.trim(), before: '' }, true);
    }
  });
  const select = (testid, label, choices, key) => {
    const el = h('select', { class: 'filter-select', 'data-testid': testid, 'aria-label': label },
      choices.map(([value, text]) => h('option', { value }, text)));
    el.addEventListener('change', () => go({ [key]: el.value, before: '' }));
    return el;
  };
  const rangeSel = select('range-select', 'Created within', RANGES, 'range');
  const minSel = select('min-duration-select', 'Minimum duration', MIN_DURATIONS, 'min_seconds');
  const triggerSel = select('trigger-select', 'Started by', TRIGGERS, 'trigger');
  const parentChip = h('button', {
    type: 'button', class: 'chip parent-chip', 'data-testid': 'parent-filter', hidden: true,
    title: 'Show all executions', onclick: () => go({ parent: '', before: '' }),
  });
  const openLink = h('a', { class: 'open-link', 'data-testid': 'open-execution', hidden: true });
  const count = h('span', { class: 'muted count' });
  const cancelBtn = h('button', { type: 'button', class: 'danger', 'data-testid': 'cancel-selected', onclick: cancelSelected }, 'Cancel selected');
  const shardBox = h('div', { class: 'warn', role: 'status', hidden: true });
  const allBox = h('input', { type: 'checkbox', 'aria-label': 'Select all shown' });
  allBox.addEventListener('change', () => {
    for (const id of rows.keys()) (allBox.checked ? selected.add(id) : selected.delete(id));
    render();
  });
  const tbody = h('tbody');
  const table = h('table', { class: 'grid exec-table' },
    h('thead', null, h('tr', null,
      h('th', { class: 'sel' }, allBox), h('th', null, 'ID'), h('th', null, 'Playbook'),
      h('th', null, 'Status'), h('th', null, 'Progress'), h('th', null, 'Created'), h('th', { class: 'num' }, 'Duration'),
      h('th', null, 'Parent'))),
    tbody);
  const empty = h('p', { class: 'empty' });
  const newestBtn = h('button', { type: 'button', onclick: () => go({ before: '' }) }, '← Newest');
  const olderBtn = h('button', {
    type: 'button', 'data-testid': 'older-button', onclick: () => nextBefore && go({ before: nextBefore }),
  }, 'Older →');

  root.append(h('section', { class: 'list-view' },
    h('div', { class: 'toolbar' },
      h('div', { class: 'tabs', role: 'tablist', 'aria-label': 'Status' }, tabButtons.map(([, b]) => b)),
      filter, rangeSel, minSel, triggerSel, parentChip, openLink, h('span', { class: 'spacer' }), count, cancelBtn),
    shardBox,
    h('div', { class: 'table-wrap' }, table),
    empty,
    h('div', { class: 'pager' }, newestBtn, olderBtn),
    h('p', { class: 'hint muted' }, 'Keys: j/k or ↑/↓ move · Enter opens · Space selects · / filters')));

  function go(changes, replace = false) {
    const qs = new URLSearchParams(Object.entries({ ...params, ...changes }).filter(([, v]) => v)).toString();
    const url = `${location.pathname}${qs ? `?${qs}` : ''}`;
    if (replace) history.replaceState(null, '', url);
    else history.pushState(null, '', url);
    update();
  }

  const FILTERS = ['status', 'playbook', 'range', 'min_seconds', 'parent', 'trigger', 'before'];

  function update() {
    const old = params;
    params = readParams();
    if (document.activeElement !== filter) filter.value = params.playbook;
    rangeSel.value = params.range;
    minSel.value = params.min_seconds;
    triggerSel.value = params.trigger;
    if (FILTERS.some((k) => old[k] !== params[k])) restart();
    else render();
  }

  function restart() {
    if (poller) poller.stop();
    poller = null;
    items = [];
    nextBefore = null;
    loaded = false;
    render();
    if (params.before) load();
    else poller = new Poller(load, 2000).start();
  }

  async function load() {
    const mine = ++seq;
    const q = new URLSearchParams({ limit: '50' });
    if (params.status) q.set('status', params.status);
    if (params.playbook) q.set('playbook', params.playbook);
    const range = RANGES.find(([key]) => key === params.range);
    if (range && range[2]) q.set('since', String(Math.floor(Date.now() / 1000) - range[2]));
    if (params.min_seconds) q.set('min_seconds', params.min_seconds);
    if (params.parent) q.set('parent', params.parent);
    if (params.trigger) q.set('trigger', params.trigger);
    if (params.before) q.set('before', params.before);
    try {
      const data = await api(`/api/executions?${q}`);
      if (dead || mine !== seq) return !dead;
      items = (data && data.items) || [];
      nextBefore = data && data.next_before != null ? String(data.next_before) : null;
      shards = (data && data.unavailable_shards) || [];
      loaded = true;
      const known = new Set(items.map((it) => String(it.execution_id)));
      for (const id of selected) if (!known.has(id)) selected.delete(id);
      render();
    } catch (err) {
      if (dead || err.status === 401) return false;
      message(`Could not load executions: ${err.message}`);
    }
    return true;
  }

  // The server filters; only the parent is checked here too (a server that ignores
  // `parent` would otherwise list every execution as a child).
  function visible() {
    if (!params.parent) return items;
    return items.filter((it) => String(it.parent_execution_id ?? '') === params.parent);
  }

  function makeRow(id) {
    const check = h('input', { type: 'checkbox', 'aria-label': `Select execution ${id}` });
    check.addEventListener('change', () => {
      if (check.checked) selected.add(id); else selected.delete(id);
      chrome();
    });
    const cells = {
      id: h('td', { class: 'nowrap' }), playbook: h('td', { class: 'playbook' }), status: h('td'),
      progress: h('td', { class: 'progress-cell' }), created: h('td', { class: 'nowrap' }),
      duration: h('td', { class: 'num nowrap' }), parent: h('td'),
    };
    const tr = h('tr', { 'data-testid': 'exec-row', 'data-id': id, tabindex: -1 },
      h('td', { class: 'sel' }, check), cells.id,
      cells.playbook, cells.status, cells.progress, cells.created, cells.duration, cells.parent);
    tr.addEventListener('click', (ev) => {
      if (!(ev.target instanceof Element) || !ev.target.closest('a,input,button')) setCursor(id, false);
    });
    return { id, tr, check, cells, sig: '' };
  }

  function fillRow(r, it) {
    r.tr.dataset.status = it.status ?? '';
    r.check.checked = selected.has(r.id);
    // A run still going shows how long it has been going (updated with each refresh).
    const end = TERMINAL.has(it.status) ? (it.ended ?? it.updated) : Math.floor(Date.now() / 1000);
    const took = Number.isFinite(it.duration) ? it.duration : Math.max(0, end - it.created);
    const prog = progressOf(it);
    const parent = it.parent_execution_id != null ? String(it.parent_execution_id) : null;
    const sig = JSON.stringify([it.status, it.playbook, it.version, parent, it.created, took, prog, it.trigger]);
    if (sig !== r.sig) {
      r.sig = sig;
      const c = r.cells;
      fill(c.id, parent ? h('span', {
        class: 'sub-marker', 'data-testid': 'sub-marker', title: `Sub-execution of ${parent}`, 'aria-label': 'Sub-execution',
      }, '↳ ') : null, execLink(r.id));
      fill(c.playbook, h('span', null, it.playbook ?? '—'),
        it.version != null ? h('span', { class: 'muted ver' }, ` v${it.version}`) : null,
        triggerBadge(it.trigger));
      c.playbook.title = String(it.playbook ?? '');
      c.status.replaceChildren(badge(it.status));
      fillProgress(c.progress, it.status, prog);
      c.duration.textContent = duration(took);
      c.created.title = absTime(it.created);
      c.parent.replaceChildren(parent != null
        ? execLink(parent, { 'data-testid': 'row-parent-link', title: `Parent execution ${parent}` })
        : h('span', { class: 'muted' }, '—'));
    }
    setText(r.cells.created, relTime(it.created));
  }

  function fillProgress(td, status, p) {
    if (!p && status === 'completed') {
      // An ended run's counts are not in the list (its page has them): all of it ran.
      const fillEl = h('div', { class: 'fill' });
      fillEl.style.width = '100%';
      td.replaceChildren(
        h('div', {
          class: `progress mini ${statusClass(status)}`, 'data-testid': 'row-progress', role: 'progressbar',
          'aria-label': 'Progress: completed', title: 'completed', 'data-done': 'all',
        }, fillEl),
        h('span', { class: 'progress-num muted' }, 'done'));
      return;
    }
    if (!p) {
      td.replaceChildren(h('span', { class: 'muted' }, '—'));
      return;
    }
    const pct = p.total > 0 ? Math.min(100, (100 * p.done) / p.total) : 0;
    const fillEl = h('div', { class: 'fill' });
    fillEl.style.width = `${pct}%`;
    const what = p.iter ? 'iterations' : 'steps';
    const tip = `${p.done} of ${p.total} ${what}${p.failed ? ` · ${p.failed} failed` : ''}`
      + `${p.iter ? ` · ${p.stepsDone ?? 0} of ${p.steps ?? 0} steps` : ''}`;
    td.replaceChildren(
      h('div', {
        class: `progress mini ${statusClass(status)}`, 'data-testid': 'row-progress', role: 'progressbar',
        'aria-label': `Progress: ${tip}`, 'aria-valuemin': 0, 'aria-valuemax': p.total, 'aria-valuenow': p.done,
        'data-done': p.done, 'data-total': p.total, title: tip,
      }, fillEl),
      h('span', { class: 'progress-num', title: tip }, p.total > 0 ? `${p.done}/${p.total}` : '—'));
  }

  function render() {
    if (dead) return;
    const focused = document.activeElement;
    const list = visible();
    const ids = new Set(list.map((it) => String(it.execution_id)));
    for (const [id, r] of rows) {
      if (!ids.has(id)) { r.tr.remove(); rows.delete(id); }
    }
    list.forEach((it, i) => {
      const id = String(it.execution_id);
      let r = rows.get(id);
      if (!r) { r = makeRow(id); rows.set(id, r); }
      fillRow(r, it);
      const at = tbody.children[i];
      if (at !== r.tr) tbody.insertBefore(r.tr, at || null);
    });
    if (cursor && !rows.has(cursor)) cursor = null;
    for (const [id, r] of rows) r.tr.classList.toggle('cursor', id === cursor);
    if (focused && focused !== document.activeElement && focused.isConnected) focused.focus({ preventScroll: true });
    chrome();
  }

  function chrome() {
    for (const [key, b] of tabButtons) {
      b.setAttribute('aria-selected', String((params.status || 'all') === key));
    }
    const q = params.playbook.trim();
    const digits = /^\d+$/.test(q);
    openLink.hidden = !digits;
    if (digits) {
      openLink.href = execPath(q);
      openLink.textContent = `Open execution ${q}`;
    }
    const shown = rows.size;
    setText(count, loaded ? `${shown} shown${shown !== items.length ? ` of ${items.length}` : ''}` : '');
    const cancellable = items.filter((it) => selected.has(String(it.execution_id)) && CANCELLABLE.has(it.status));
    cancelBtn.disabled = cancellable.length === 0;
    setText(cancelBtn, cancellable.length ? `Cancel selected (${cancellable.length})` : 'Cancel selected');
    const picked = [...rows.keys()].filter((id) => selected.has(id)).length;
    allBox.checked = shown > 0 && picked === shown;
    allBox.indeterminate = picked > 0 && picked < shown;
    olderBtn.hidden = !nextBefore;
    newestBtn.hidden = !params.before;
    shardBox.hidden = shards.length === 0;
    setText(shardBox, shards.map((s) => `Shard ${s.shard} unavailable: ${s.error}`).join(' · '));
    empty.hidden = loaded && shown > 0;
    parentChip.hidden = !params.parent;
    setText(parentChip, params.parent ? `Sub-executions of ${params.parent} ×` : '');
    const filtered = FILTERS.some((k) => k !== 'before' && params[k]);
    setText(empty, !loaded ? 'Loading…' : filtered ? 'No execution matches the filters.' : 'No executions.');
  }

  function setCursor(id, scroll = true) {
    cursor = id;
    for (const [rid, r] of rows) r.tr.classList.toggle('cursor', rid === id);
    const r = rows.get(id);
    if (r && scroll) {
      r.tr.focus({ preventScroll: true }); // keys now act on the row, not a button
      r.tr.scrollIntoView({ block: 'nearest' });
    }
  }

  function move(step) {
    const order = [...tbody.children].map((tr) => tr.dataset.id);
    if (!order.length) return;
    const at = cursor ? order.indexOf(cursor) : -1;
    const next = at < 0 ? (step > 0 ? 0 : order.length - 1) : Math.min(order.length - 1, Math.max(0, at + step));
    setCursor(order[next]);
  }

  function toggle(id) {
    if (selected.has(id)) selected.delete(id); else selected.add(id);
    render();
  }

  function onKey(ev) {
    if (ev.defaultPrevented || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const t = ev.target instanceof Element ? ev.target : document.body;
    if (t.matches('input:not([type=checkbox]), textarea, select, [contenteditable]')) {
      if (t === filter && (ev.key === 'ArrowDown' || ev.key === 'Escape')) {
        ev.preventDefault();
        filter.blur();
        if (ev.key === 'ArrowDown') move(1);
      }
      return;
    }
    const k = ev.key;
    if (k === '/') {
      ev.preventDefault();
      filter.focus();
      filter.select();
    } else if (k === 'j' || k === 'ArrowDown' || k === 'k' || k === 'ArrowUp') {
      ev.preventDefault();
      move(k === 'j' || k === 'ArrowDown' ? 1 : -1);
    } else if (k === 'Enter' && cursor && !t.closest('a,button')) {
      ev.preventDefault();
      ctx.navigate(execPath(cursor));
    } else if (k === ' ' && cursor && !t.closest('a,button,input')) {
      ev.preventDefault();
      toggle(cursor);
    }
  }

  async function cancelSelected() {
    const targets = items
      .filter((it) => selected.has(String(it.execution_id)) && CANCELLABLE.has(it.status))
      .map((it) => String(it.execution_id));
    if (!targets.length) return;
    cancelBtn.disabled = true;
    const results = await Promise.allSettled(targets.map((id) => api(`/api/executions/${enc(id)}/cancel`,
      { method: 'POST', body: { reason: 'cancelled from the UI' } })));
    if (dead) return;
    const failures = [];
    results.forEach((res, i) => {
      if (res.status === 'fulfilled') selected.delete(targets[i]);
      else failures.push(`${targets[i]}: ${res.reason.message}`);
    });
    const ok = targets.length - failures.length;
    if (failures.length) {
      message(`${ok ? `Cancel requested for ${ok}; ` : ''}${failures.length} could not be cancelled — ${failures[0]}`
        + `${failures.length > 1 ? ` (and ${failures.length - 1} more)` : ''}`);
    } else {
      message(`Cancel requested for ${ok} execution${ok === 1 ? '' : 's'}.`, 'info');
    }
    if (poller) poller.kick(); else load();
    chrome();
  }

  document.addEventListener('keydown', onKey);
  document.title = 'Executions · flowtide';
  filter.value = params.playbook;
  rangeSel.value = params.range;
  minSel.value = params.min_seconds;
  triggerSel.value = params.trigger;
  restart();

  return {
    update,
    destroy() {
      dead = true;
      clearTimeout(typing);
      if (poller) poller.stop();
      document.removeEventListener('keydown', onKey);
    },
  };
}
