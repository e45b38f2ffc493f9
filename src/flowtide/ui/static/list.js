// The executions list: status tabs, a text filter, a keyboard-driven table refreshed
// every 2 s (page 1 only), paging to older executions and cancelling a selection.
import { api, enc } from './api.js';
import {
  h, fill, badge, setText, relTime, absTime, duration, execLink, execPath, message, Poller,
  TERMINAL,
} from './util.js';

const TABS = [
  ['all', 'All'], ['running', 'Running'], ['completed', 'Completed'],
  ['failed', 'Failed'], ['cancelled', 'Cancelled'],
];
const CANCELLABLE = new Set(['running', 'pending']);

function readParams() {
  const q = new URLSearchParams(location.search);
  return { status: q.get('status') || '', q: q.get('q') || '', before: q.get('before') || '' };
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
    type: 'search', class: 'filter', 'data-testid': 'filter-input', placeholder: 'Filter by playbook or id   /',
    'aria-label': 'Filter executions by playbook or id', autocomplete: 'off', spellcheck: 'false',
  });
  filter.addEventListener('input', () => go({ q: filter.value }, true));
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
      h('th', null, 'Status'), h('th', null, 'Created'), h('th', { class: 'num' }, 'Duration'),
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
      filter, openLink, h('span', { class: 'spacer' }), count, cancelBtn),
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

  function update() {
    const old = params;
    params = readParams();
    if (document.activeElement !== filter) filter.value = params.q;
    if (old.status !== params.status || old.before !== params.before) restart();
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

  function visible() {
    const q = params.q.trim().toLowerCase();
    if (!q) return items;
    return items.filter((it) => String(it.execution_id).toLowerCase().includes(q)
      || String(it.playbook ?? '').toLowerCase().includes(q));
  }

  function makeRow(id) {
    const check = h('input', { type: 'checkbox', 'aria-label': `Select execution ${id}` });
    check.addEventListener('change', () => {
      if (check.checked) selected.add(id); else selected.delete(id);
      chrome();
    });
    const cells = {
      playbook: h('td', { class: 'playbook' }), status: h('td'), created: h('td', { class: 'nowrap' }),
      duration: h('td', { class: 'num nowrap' }), parent: h('td'),
    };
    const tr = h('tr', { 'data-testid': 'exec-row', 'data-id': id, tabindex: -1 },
      h('td', { class: 'sel' }, check), h('td', null, execLink(id)),
      cells.playbook, cells.status, cells.created, cells.duration, cells.parent);
    tr.addEventListener('click', (ev) => {
      if (!(ev.target instanceof Element) || !ev.target.closest('a,input,button')) setCursor(id, false);
    });
    return { id, tr, check, cells, sig: '' };
  }

  function fillRow(r, it) {
    r.tr.dataset.status = it.status ?? '';
    r.check.checked = selected.has(r.id);
    // A run still going shows how long it has been going (updated with each refresh).
    const end = TERMINAL.has(it.status) ? it.updated : Math.floor(Date.now() / 1000);
    const sig = JSON.stringify([it.status, it.playbook, it.version, it.parent_execution_id, it.created, end]);
    if (sig !== r.sig) {
      r.sig = sig;
      const c = r.cells;
      fill(c.playbook, h('span', null, it.playbook ?? '—'),
        it.version != null ? h('span', { class: 'muted ver' }, ` v${it.version}`) : null);
      c.playbook.title = String(it.playbook ?? '');
      c.status.replaceChildren(badge(it.status));
      c.duration.textContent = duration(Math.max(0, end - it.created));
      c.created.title = absTime(it.created);
      c.parent.replaceChildren(it.parent_execution_id != null
        ? execLink(String(it.parent_execution_id))
        : h('span', { class: 'muted' }, '—'));
    }
    setText(r.cells.created, relTime(it.created));
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
    const q = params.q.trim();
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
    setText(empty, !loaded ? 'Loading…' : items.length ? 'No execution matches the filter.' : 'No executions.');
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
  filter.value = params.q;
  restart();

  return {
    update,
    destroy() {
      dead = true;
      if (poller) poller.stop();
      document.removeEventListener('keydown', onKey);
    },
  };
}
