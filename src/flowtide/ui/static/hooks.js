// Webhooks: each hook with the URL senders POST to, its playbook and rate, its latest
// deliveries as coloured squares (each a link to the run it started) and, on a server,
// the deliveries it refused lately with why (bad signature, stale timestamp, over the rate).
import { api, enc } from './api.js';
import { h, relTime, execPath, Poller } from './util.js';
import { squares } from './schedules.js';

function playbookOf(ref) {
  if (!ref) return '—';
  if (ref.file) return ref.file;
  return ref.version ? `${ref.path}@${ref.version}` : ref.path;
}

export function mountHooks(root) {
  const body = h('div', { class: 'hooks' });
  root.replaceChildren(h('section', { class: 'hooks-view' },
    h('div', { class: 'toolbar' }, h('h1', { class: 'page-title' }, 'Webhooks')), body));
  document.title = 'Webhooks · flowtide';

  async function refresh() {
    let items;
    try {
      items = (await api('/api/hooks')).items || [];
    } catch (err) {
      body.replaceChildren(h('p', { class: 'muted empty' }, err.message));
      return err.status !== 403;
    }
    if (!items.length) {
      body.replaceChildren(h('div', { class: 'empty', 'data-testid': 'hooks-none' },
        h('p', null, 'No webhooks yet. Add one from the command line:'),
        h('pre', { class: 'mono' }, 'flowtide hook add NAME PLAYBOOK --secret-file hook.secret')));
      return true;
    }
    const docs = await Promise.all(items.slice(0, 50).map((hk) =>
      api(`/api/hooks/${enc(hk.name)}`).catch(() => null)));
    body.replaceChildren(...docs.filter(Boolean).map((d) => {
      const deliveries = (d.deliveries || []).map((x) => ({
        key: x.delivery, status: x.status, execution_id: x.execution_id,
        execution_status: x.execution_status, reason: null,
      }));
      const refused = d.refused || [];
      return h('div', { class: 'hook', 'data-testid': 'hook', 'data-name': d.name },
        h('h2', { class: 'pool-title' }, d.name),
        h('table', { class: 'kv' }, h('tbody', null,
          h('tr', null, h('th', null, 'Deliver to'), h('td', { class: 'mono' }, `POST ${d.url}`)),
          h('tr', null, h('th', null, 'Playbook'), h('td', null, playbookOf(d.playbook))),
          h('tr', null, h('th', null, 'Rate'), h('td', null, d.rate ? `${d.rate}/s (per server)` : 'the default')),
          h('tr', null, h('th', null, 'Latest deliveries'), h('td', null, squares(deliveries))))),
        refused.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'grid' },
          h('thead', null, h('tr', null, ...['Refused', 'Status', 'Why', 'Delivery id'].map((t) => h('th', null, t)))),
          h('tbody', null, ...refused.map((r) => h('tr', { 'data-testid': 'refused-row' },
            h('td', null, relTime(r.time)), h('td', { class: 'num' }, String(r.status)),
            h('td', null, r.why), h('td', { class: 'mono' }, r.delivery ?? '—')))))) : null,
        deliveries.length ? h('p', { class: 'muted small' }, 'Latest run: ',
          deliveries[0].execution_id ? h('a', { href: execPath(deliveries[0].execution_id), class: 'mono' }, deliveries[0].execution_id) : '—') : null);
    }));
    return true;
  }

  const poller = new Poller(refresh, 3000).start();
  return { destroy() { poller.stop(); } };
}
