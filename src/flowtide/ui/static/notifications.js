// The execution page's Notifications panel: each delivery of the run's `notify:` targets
// (from the summary's `notifications`): on which transition, the target kind and where it
// goes (masked by the server: no credentials, query string or token), sent, retrying or
// given up, its attempts, the latest error and when. Hidden while there is none.
import { h, fill, badge, relTime, absTime, execLink } from './util.js';

/** The colour of an outcome agrees with the run statuses': sent green, failed red. */
const OUTCOME = { sent: 'completed', retrying: 'running', failed: 'failed' };
/** A transition's colour: the run status it reports (a missed deadline as a failure). */
const TRANSITION = { completed: 'completed', failed: 'failed', cancelled: 'cancelled', deadline_missed: 'failed' };

function outcome(d) {
  const shown = badge(d.status, { class: `badge st-${OUTCOME[d.status] || 'unknown'}`, 'data-testid': 'notification-status' });
  if (d.status !== 'retrying' || d.retry_at == null) return shown;
  const soon = d.retry_at - Date.now() / 1000 < 5;
  return [shown, h('span', { class: 'muted small', title: absTime(d.retry_at) }, soon ? ' again in a moment' : ` again ${relTime(d.retry_at)}`)];
}

function detail(d) {
  const parts = [];
  if (d.status_code != null) parts.push(h('span', { class: 'mono' }, `HTTP ${d.status_code}`));
  if (d.error && d.error !== `HTTP ${d.status_code}`) parts.push(h('span', { class: 'notification-error', 'data-testid': 'notification-error' }, d.error));
  if (d.started_execution_id) parts.push(['started ', execLink(d.started_execution_id)]);
  if (!parts.length) return '—';
  return parts.flatMap((p, i) => (i ? [' · ', p] : [p]));
}

export function notificationsPanel() {
  const el = h('section', { class: 'notifications', 'data-testid': 'notifications', hidden: true });
  let sig = '';

  function update(summary) {
    const list = (summary && summary.notifications) || [];
    const owed = (summary && summary.notifications_owed) || 0;
    const next = JSON.stringify([list, owed, Math.floor(Date.now() / 30000)]);
    if (next === sig) return;
    sig = next;
    el.hidden = !list.length && !owed;
    if (el.hidden) return;
    const failed = list.filter((d) => d.status === 'failed').length;
    fill(el,
      h('h3', null, `Notifications (${list.length})`,
        failed ? h('span', { class: 'notification-error' }, ` · ${failed} not delivered`) : null),
      owed ? h('p', { class: 'note', 'data-testid': 'notifications-owed' },
        `${owed} ${owed === 1 ? 'delivery' : 'deliveries'} owed, not sent yet: this page shows them as they are tried.`) : null,
      list.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'grid compact notifications-table' },
        h('thead', null, h('tr', null, ['When', 'On', 'Target', 'To', 'Outcome', 'Attempts', 'Detail'].map((t) => h('th', null, t)))),
        h('tbody', null, list.map((d) => h('tr', {
          'data-testid': 'notification-row', 'data-status': d.status, 'data-on': d.on, 'data-target': d.target,
        },
        h('td', { class: 'nowrap', title: absTime(d.time) }, relTime(d.time)),
        h('td', null, badge(d.on, { class: `badge st-${TRANSITION[d.on] || 'unknown'}` })),
        h('td', null, d.target),
        h('td', { class: 'mono notification-to', 'data-testid': 'notification-to' }, d.to),
        h('td', { class: 'nowrap' }, outcome(d)),
        h('td', { class: 'num' }, String(d.attempts)),
        h('td', null, detail(d))))))) : null);
  }

  return { el, update };
}
