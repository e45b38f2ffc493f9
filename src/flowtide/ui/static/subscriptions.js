// Subscriptions: each subscription with its source (a NATS server, never its credentials,
// and its subject, stream and durable consumer), its playbook, batch and rate, whether it
// is paused or listening (from the process that answered, when it runs the listener), its
// latest runs as coloured squares (one per message, or per batch; each a link to its run)
// among hollow red ones for messages that started no run, listed with why; operators
// pause and resume it here.
import { api, enc, ApiError } from './api.js';
import { h, badge, message, relTime, absTime, execPath, Poller } from './util.js';
import { squares, squareStatus } from './schedules.js';
import { canOperate, catalogPath } from './catalog.js';

/** Seconds as a subscription writes them: 500ms, 30s, 2m. */
function span(sec) {
  if (sec == null) return '—';
  if (sec < 1) return `${Math.round(sec * 1000)}ms`;
  return sec >= 60 && sec % 60 === 0 ? `${sec / 60}m` : `${sec}s`;
}

/** Server URLs without a user, password, query string or fragment (the API refuses a URL
 * with credentials; this keeps one out of the page whatever was stored). */
export function shownUrl(url) {
  if (!url) return null;
  return String(url).split(',').map((one) => {
    const text = one.trim();
    try {
      const u = new URL(text);
      return `${u.protocol}//${u.host}${u.pathname === '/' ? '' : u.pathname}`;
    } catch {
      return text.replace(/^([a-z][a-z0-9+.-]*:\/\/)?[^@/]*@/i, '$1').replace(/[?#].*$/, '');
    }
  }).join(', ');
}

/** Paused, listening, not connected (with why) or, where another process runs it, active. */
function state(d) {
  if (d.paused) return { text: 'paused', st: 'cancelled', why: null };
  const L = d.listener;
  if (!L) return { text: 'active', st: 'pending', why: 'listened to by a server of its shard' };
  if (L.connected) return { text: 'listening', st: 'completed', why: null };
  return { text: 'not connected', st: 'failed', why: L.error || 'connecting…' };
}

function source(d) {
  const rows = [];
  const url = shownUrl(d.url);
  if (d.source === 'nats') {
    rows.push(['Server', url
      ? h('span', { class: 'mono', 'data-testid': 'subscription-url' }, url)
      : h('span', null, 'from credential ', h('code', null, (d.auth && d.auth.credential) || d.auth || '?'))]);
    if (d.stream) rows.push(['Stream', h('span', { class: 'mono' }, d.stream)]);
    if (d.subject) rows.push([d.stream ? 'Filter' : 'Subject', h('span', { class: 'mono' }, d.subject)]);
    if (d.consumer) rows.push(['Durable consumer', h('span', { class: 'mono' }, d.consumer)]);
  } else {
    rows.push(['Source', h('span', { class: 'mono' }, d.source)]);
  }
  return rows;
}

function pace(d) {
  const parts = [];
  parts.push(d.batch ? `batches of up to ${d.batch.size} (waiting at most ${span(d.batch.max_wait)})` : 'one run per message');
  parts.push(d.rate ? `at most ${d.rate}/s` : 'no rate limit');
  return parts.join(' · ');
}

function card(d, ctx, act) {
  const st = state(d);
  const refused = d.refused || [];
  const runs = d.runs || [];
  const latest = [...runs, ...refused].sort((a, b) => b.time - a.time);
  const L = d.listener;
  const row = (label, ...value) => h('tr', null, h('th', null, label), h('td', null, ...value));
  let actions = null;
  if (canOperate(ctx.me)) {
    const verb = d.paused ? 'resume' : 'pause';
    actions = h('button', { type: 'button', 'data-testid': verb, onclick: () => act(d.name, verb) },
      d.paused ? 'Resume' : 'Pause');
  }
  return h('div', { class: 'subscription', 'data-testid': 'subscription', 'data-name': d.name, id: `sub-${d.name}` },
    h('div', { class: 'sub-head' },
      h('h2', { class: 'pool-title' }, d.name),
      badge(st.text, { class: `badge st-${st.st}`, 'data-testid': 'subscription-state' }),
      st.why ? h('span', { class: st.st === 'failed' ? 'notification-error small' : 'muted small' }, st.why) : null,
      h('span', { class: 'spacer' }), actions),
    d.description ? h('p', { class: 'muted' }, d.description) : null,
    h('table', { class: 'kv' }, h('tbody', null,
      ...source(d).map(([k, v]) => row(k, v)),
      // A local store's subscription may name a file, not a catalog path.
      row('Playbook', /\.ya?ml$/i.test(d.playbook) ? h('span', { class: 'mono' }, d.playbook)
        : h('a', { href: catalogPath(d.playbook, d.version) }, d.playbook),
        d.version != null ? h('span', { class: 'muted' }, ` v${d.version}`) : null),
      row('Runs', pace(d)),
      d.source === 'nats' && d.stream ? row('Redelivery', `after ${span(d.ack_wait)} unacked, at most ${d.max_deliver} ${d.max_deliver === 1 ? 'delivery' : 'deliveries'}`) : null,
      L ? row('This process', `${L.started} started · ${L.acked} acked · ${L.refused} refused`) : null,
      row('Latest runs', squares(latest)))),
    refused.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'grid compact' },
      h('thead', null, h('tr', null, ...['Refused', 'Message', 'Why'].map((t) => h('th', null, t)))),
      h('tbody', null, ...refused.map((f) => h('tr', { 'data-testid': 'refused-row', 'data-status': squareStatus(f) },
        h('td', { class: 'nowrap', title: absTime(f.time) }, relTime(f.time)),
        h('td', { class: 'mono' }, f.key),
        h('td', { class: 'reason' }, f.reason || '—')))))) : null,
    runs.length ? h('p', { class: 'muted small' }, 'Latest run: ',
      h('a', { href: execPath(runs[0].execution_id), class: 'mono' }, runs[0].execution_id), ` (${runs[0].key})`) : null);
}

export function mountSubscriptions(root, ctx) {
  const body = h('div', { class: 'subscriptions' });
  root.replaceChildren(h('section', { class: 'subscriptions-view' },
    h('div', { class: 'toolbar' }, h('h1', { class: 'page-title' }, 'Subscriptions')), body));
  document.title = 'Subscriptions · flowtide';

  async function act(name, verb) {
    try {
      await api(`/api/subscriptions/${enc(name)}/${verb}`, { method: 'POST' });
      message(`${name}: ${verb === 'pause' ? 'paused' : 'resumed'}`, 'info');
    } catch (err) {
      message(err instanceof ApiError && err.status === 403 ? `Not allowed: ${err.message}` : err.message);
    }
    poller.kick();
  }

  async function refresh() {
    let items;
    try {
      items = (await api('/api/subscriptions')).items || [];
    } catch (err) {
      body.replaceChildren(h('p', { class: 'muted empty' }, err.message));
      return err.status !== 403;
    }
    if (!items.length) {
      body.replaceChildren(h('div', { class: 'empty', 'data-testid': 'subscriptions-none' },
        h('p', null, 'No subscriptions yet. Add one from the command line:'),
        h('pre', { class: 'mono' }, 'flowtide subscription add orders reports/orders --auth nats_prod --stream ORDERS\n' +
          'flowtide subscription add events reports/events --url nats://127.0.0.1:4222 --subject events.new'),
        h('p', { class: 'muted' }, 'or register a kind: Subscription document with flowtide catalog register.')));
      return true;
    }
    // Each one's latest messages (one request each, at most 50).
    const docs = await Promise.all(items.slice(0, 50).map((s) =>
      api(`/api/subscriptions/${enc(s.name)}`).catch(() => null)));
    const more = items.length > 50
      ? [h('p', { class: 'muted small' }, `The first 50 of ${items.length}: flowtide subscription list has them all.`)] : [];
    body.replaceChildren(...docs.filter(Boolean).map((d) => card(d, ctx, act)), ...more);
    return true;
  }

  const poller = new Poller(refresh, 3000).start();
  return { destroy() { poller.stop(); } };
}
