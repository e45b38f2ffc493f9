// Workers and pools (a server's): each registered worker with its status, host, load and
// last heartbeat, by pool, and the outbox's backlog; refreshed every 2 s. Admins only (the
// API says so: others see its message). `flowtide ui` has no workers: its runs use threads.
import { api } from './api.js';
import { h, badge, message, Poller } from './util.js';

const STATUS = { lost: 'failed', stopped: 'cancelled', ready: 'completed', busy: 'running' };

function age(seconds) {
  if (seconds == null) return '—';
  if (seconds < 60) return `${seconds.toFixed(1)} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  return `${Math.floor(seconds / 3600)} h ago`;
}

export function mountWorkers(root) {
  const backlog = h('span', { class: 'muted', 'data-testid': 'outbox-pending' });
  const body = h('div', { class: 'workers' });
  root.replaceChildren(h('section', { class: 'workers-view' },
    h('div', { class: 'toolbar' }, h('h1', { class: 'page-title' }, 'Workers'), backlog),
    body));
  document.title = 'Workers · flowtide';

  async function refresh() {
    let doc;
    try {
      doc = await api('/api/worker/pools');
    } catch (err) {
      if (err.status === 404) {
        body.replaceChildren(h('p', { class: 'muted empty', 'data-testid': 'workers-none' },
          'No workers here: runs of the local store use threads of the `flowtide run` that started them.'));
        return false;
      }
      body.replaceChildren(h('p', { class: 'muted empty', 'data-testid': 'workers-refused' }, err.message));
      if (err.status !== 403) message(err.message);
      return err.status !== 403;
    }
    try {
      const pending = await api('/api/internal/outbox/pending-count');
      backlog.textContent = `${pending.pending ?? pending.count ?? 0} notifications waiting to be published`;
    } catch { backlog.textContent = ''; }
    const pools = doc.pools || [];
    if (!pools.length) {
      body.replaceChildren(h('p', { class: 'muted empty' }, 'No worker has registered yet.'));
      return true;
    }
    body.replaceChildren(...pools.map((pool) => h('div', { class: 'pool', 'data-testid': 'pool', 'data-pool': pool.pool },
      h('h2', { class: 'pool-title' }, `Pool ${pool.pool}`,
        h('span', { class: 'muted' }, ` · ${pool.workers.length} worker${pool.workers.length === 1 ? '' : 's'}`)),
      h('div', { class: 'table-wrap' }, h('table', { class: 'grid' },
        h('thead', null, h('tr', null, ...['Worker', 'Status', 'Host', 'PID', 'Running', 'Last heartbeat']
          .map((t) => h('th', null, t)))),
        h('tbody', null, ...pool.workers.map((w) => {
          const status = w.status === 'ready' && w.running > 0 ? 'busy' : w.status;
          return h('tr', { 'data-testid': 'worker-row', 'data-id': w.worker_id, 'data-status': status },
            h('td', { class: 'mono' }, w.worker_id),
            h('td', null, badge(status, { class: `badge ${'st-' + (STATUS[status] || 'pending')}` })),
            h('td', null, w.hostname ?? '—'),
            h('td', { class: 'num' }, w.pid ?? '—'),
            h('td', { class: 'num' }, `${w.running ?? 0} / ${w.concurrency ?? '?'}`),
            h('td', null, age(w.last_heartbeat_age)));
        })))))));
    return true;
  }

  const poller = new Poller(refresh, 2000).start();
  return { destroy() { poller.stop(); } };
}
