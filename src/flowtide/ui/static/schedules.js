// Schedules: every schedule with its next fire time (in the viewer's zone and the
// schedule's) and its latest runs as coloured squares; one schedule's page with its next
// five fire times, its firings, and for operators pause/resume, trigger and backfill.
import { api, enc, ApiError } from './api.js';
import { h, badge, message, relTime, execPath, Poller } from './util.js';
import { canOperate } from './catalog.js';

const SQUARES = 30;
export const schedulePath = (name) => `/ui/schedules/${enc(name)}`;

/** A time in `zone` (IANA) and, when it differs, the viewer's: "02:00 CET (01:00 here)". */
function when(ts, zone) {
  if (ts == null) return '—';
  const d = new Date(ts * 1000);
  const opts = { year: 'numeric', month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit' };
  const there = new Intl.DateTimeFormat([], { ...opts, timeZone: zone, timeZoneName: 'short' }).format(d);
  const here = new Intl.DateTimeFormat([], { ...opts, timeZoneName: 'short' }).format(d);
  return there === here ? here : `${there} (${here} here)`;
}

/** Seconds as a schedule writes them: 90s, 15m, 1h, 1d. */
function span(sec) {
  for (const [unit, size] of [['d', 86400], ['h', 3600], ['m', 60]]) {
    if (sec >= size && sec % size === 0) return `${sec / size}${unit}`;
  }
  return `${sec}s`;
}

/** The colour of one firing: its run's status (a subscription's batched message: its
 * batch's run), or skipped / buffered, or refused (a message that started no run). */
export function squareStatus(f) {
  if (f.status === 'started' || f.status === 'batched') {
    return f.execution_status === 'created' ? 'running' : (f.execution_status || 'running');
  }
  if (f.status === 'failed') return 'refused';
  return f.status === 'buffered' ? 'pending' : 'skipped';
}

/** A firing as a small square linking to its run (oldest left). */
function square(f) {
  const status = squareStatus(f);
  const what = f.status === 'started' ? status : f.status === 'batched' ? `in a batch, ${status}` : f.status;
  const title = `${f.key}: ${what}${f.reason ? ` (${f.reason})` : ''}`;
  const attrs = { class: `square st-${status}`, title, 'aria-label': title, 'data-testid': 'square', 'data-status': status };
  return f.execution_id ? h('a', { ...attrs, href: execPath(f.execution_id) }) : h('span', attrs);
}

export function squares(firings) {
  const shown = (firings || []).slice(0, SQUARES).reverse();
  if (!shown.length) return h('span', { class: 'muted' }, 'no runs yet');
  return h('span', { class: 'squares', role: 'list' }, ...shown.map(square));
}

export function mountSchedules(root, ctx) {
  const body = h('div', { class: 'schedules' });
  root.replaceChildren(h('section', { class: 'schedules-view' },
    h('div', { class: 'toolbar' }, h('h1', { class: 'page-title' }, 'Schedules')), body));
  document.title = 'Schedules · flowtide';

  async function refresh() {
    let items;
    try {
      items = (await api('/api/schedules')).items || [];
    } catch (err) {
      body.replaceChildren(h('p', { class: 'muted empty' }, err.message));
      return err.status !== 403;
    }
    if (!items.length) {
      body.replaceChildren(h('div', { class: 'empty', 'data-testid': 'schedules-none' },
        h('p', null, 'No schedules yet. Add one from the command line:'),
        h('pre', { class: 'mono' }, 'flowtide schedule add NAME PLAYBOOK --every 15m\nflowtide schedule add nightly reports/nightly --cron "0 2 * * *" --timezone Europe/Berlin'),
        h('p', { class: 'muted' }, 'or register a kind: Schedule document with flowtide catalog register.')));
      return true;
    }
    // The latest firings of the first schedules (one request each, at most 50).
    const docs = await Promise.all(items.slice(0, 50).map((s) =>
      api(`/api/schedules/${enc(s.name)}`).catch(() => null)));
    const byName = new Map(docs.filter(Boolean).map((d) => [d.name, d]));
    body.replaceChildren(h('div', { class: 'table-wrap' }, h('table', { class: 'grid schedule-table' },
      h('thead', null, h('tr', null, ...['Schedule', 'When', 'Playbook', 'Overlap', 'State', 'Next', 'Latest runs']
        .map((t) => h('th', null, t)))),
      h('tbody', null, ...items.map((s) => h('tr', { 'data-testid': 'schedule-row', 'data-name': s.name },
        h('td', null, h('a', { href: schedulePath(s.name) }, s.name),
          s.description ? h('div', { class: 'muted small' }, s.description) : null),
        h('td', { class: 'mono' }, s.when),
        h('td', null, h('a', { href: `/ui/catalog/${s.playbook.split('/').map(enc).join('/')}` }, s.playbook)),
        h('td', null, s.overlap),
        h('td', null, badge(s.paused ? 'paused' : 'active', { class: `badge st-${s.paused ? 'cancelled' : 'completed'}` })),
        h('td', { 'data-testid': 'schedule-next' }, s.paused ? '—' : when(s.next[0], s.timezone)),
        h('td', null, squares((byName.get(s.name) || {}).firings))))))));
    return true;
  }

  const poller = new Poller(refresh, 3000).start();
  return { destroy() { poller.stop(); } };
}

export function mountSchedule(root, ctx, name) {
  const head = h('div', { class: 'toolbar' });
  const info = h('div', { class: 'schedule-info' });
  const actions = h('div', { class: 'toolbar schedule-actions' });
  const runs = h('div', { class: 'schedule-runs' });
  root.replaceChildren(h('section', { class: 'schedule-view' }, head, info, actions, runs));
  document.title = `${name} · Schedules · flowtide`;
  let doc = null;

  async function act(verb, body) {
    try {
      const answer = await api(`/api/schedules/${enc(name)}/${verb}`, { method: 'POST', body });
      if (verb === 'trigger') message(`Started execution ${answer.execution_id}`, 'info');
      if (verb === 'backfill') {
        message(`Backfill: ${Object.keys(answer.started).length} started, ${answer.buffered.length} buffered, ` +
          `${answer.skipped.length} skipped, ${answer.already.length} had run before`, 'info');
      }
      poller.kick();
      return answer;
    } catch (err) {
      message(err instanceof ApiError && err.status === 403 ? `Not allowed: ${err.message}` : err.message);
      return null;
    }
  }

  function backfillForm() {
    const from = h('input', { type: 'datetime-local', id: 'bf-from', required: true, 'data-testid': 'backfill-from' });
    const to = h('input', { type: 'datetime-local', id: 'bf-to', required: true, 'data-testid': 'backfill-to' });
    const go = h('button', { type: 'submit', 'data-testid': 'backfill-go' }, 'Backfill');
    const form = h('form', { class: 'backfill', 'aria-label': 'Backfill a range' },
      h('label', { for: 'bf-from' }, 'From'), from, h('label', { for: 'bf-to' }, 'to'), to, go,
      h('span', { class: 'muted small' }, 'your time zone; every slot in the range, at most 1,000'));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      if (!from.value || !to.value) { message('Give both ends of the range.'); return; }
      // datetime-local is the viewer's wall time: send the instant with its offset.
      const iso = (value) => new Date(value).toISOString();
      go.disabled = true;
      await act('backfill', { start: iso(from.value), end: iso(to.value) });
      go.disabled = false;
    });
    return form;
  }

  async function refresh() {
    try {
      doc = await api(`/api/schedules/${enc(name)}`);
    } catch (err) {
      info.replaceChildren(h('p', { class: 'muted empty', 'data-testid': 'schedule-missing' }, err.message));
      return err.status !== 404;
    }
    head.replaceChildren(h('h1', { class: 'page-title' }, h('a', { href: '/ui/schedules' }, 'Schedules'), ' / ', doc.name),
      badge(doc.paused ? 'paused' : 'active', { class: `badge st-${doc.paused ? 'cancelled' : 'completed'}`, 'data-testid': 'schedule-state' }));
    const row = (label, ...value) => h('tr', null, h('th', null, label), h('td', null, ...value));
    info.replaceChildren(h('table', { class: 'kv' }, h('tbody', null,
      doc.description ? row('About', doc.description) : null,
      row('Playbook', doc.playbook, doc.version ? ` version ${doc.version}` : ''),
      row('When', h('span', { class: 'mono' }, doc.when)),
      row('Overlap', doc.overlap),
      row('Catch-up', doc.catchup ? span(doc.catchup) : 'none'),
      doc.jitter ? row('Jitter', `up to ${span(doc.jitter)}`) : null,
      Object.keys(doc.workload || {}).length ? row('Workload', h('code', null, JSON.stringify(doc.workload))) : null,
      row('Next', doc.next.length
        ? h('ol', { class: 'next-times', 'data-testid': 'next-times' }, ...doc.next.map((t) => h('li', null, when(t, doc.timezone))))
        : (doc.paused ? 'paused' : '—')),
      doc.running.length ? row('Running', ...doc.running.map((id) => h('a', { href: execPath(id), class: 'mono' }, `${id} `))) : null)));
    if (canOperate(ctx.me)) {
      const toggle = h('button', { type: 'button', 'data-testid': doc.paused ? 'resume' : 'pause' }, doc.paused ? 'Resume' : 'Pause');
      toggle.addEventListener('click', () => act(doc.paused ? 'resume' : 'pause'));
      const trigger = h('button', { type: 'button', class: 'primary', 'data-testid': 'trigger' }, 'Run now');
      trigger.addEventListener('click', () => act('trigger'));
      if (!actions.querySelector('form')) actions.replaceChildren(toggle, trigger, backfillForm());
      else actions.replaceChildren(toggle, trigger, actions.querySelector('form'));
    } else {
      actions.replaceChildren(h('p', { class: 'note' }, 'Pausing, running and backfilling need the operator role.'));
    }
    const firings = doc.firings || [];
    runs.replaceChildren(h('h2', null, 'Latest firings'), squares(firings),
      firings.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'grid' },
        h('thead', null, h('tr', null, ...['Slot', 'What', 'Run', 'Recorded'].map((t) => h('th', null, t)))),
        h('tbody', null, ...firings.map((f) => h('tr', { 'data-testid': 'firing-row', 'data-status': f.status },
          h('td', { class: 'mono' }, f.key),
          h('td', null, badge(squareStatus(f)), f.reason ? h('span', { class: 'muted' }, ` ${f.reason}`) : null),
          h('td', null, f.execution_id ? h('a', { href: execPath(f.execution_id), class: 'mono' }, f.execution_id) : '—'),
          h('td', null, relTime(f.time))))))) : null);
    return true;
  }

  const poller = new Poller(refresh, 3000).start();
  return { destroy() { poller.stop(); } };
}
