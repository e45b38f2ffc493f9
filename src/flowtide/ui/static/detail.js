// One execution: header with status and progress, the Graph tab (with the step panel) and
// the Events tab. The summary is polled every second until the execution is terminal.
import { api, enc } from './api.js';
import {
  h, fill, badge, setBadge, setText, relTime, absTime, duration, execLink, message, statusClass, Poller, TERMINAL,
} from './util.js';
import { buildGraph } from './graph.js';
import { EventLog, eventsView, eventRows } from './events.js';
import { timelineView } from './timeline.js';

const STEP_EVENTS_SHOWN = 100;
const ZOOMS = [0.4, 0.55, 0.7, 0.85, 1, 1.25, 1.5];
const LEGEND = ['pending', 'running', 'completed', 'failed', 'skipped'];

export function mountDetail(root, ctx, id) {
  let dead = false;
  let summary = null;
  let tab = 'graph';
  let step = null;
  let graph = null;
  let events = null;
  let timeline = null;
  let zoomAt = ZOOMS.indexOf(1);
  let metaSig = '';
  let panelSig = '';
  let errorDetailsOpen = false;
  const stepExpanded = new Set();
  const log = new EventLog(id, () => Boolean(summary && TERMINAL.has(summary.status)));

  const status = badge('loading', { 'data-testid': 'detail-status' });
  const cancelBtn = h('button', {
    type: 'button', class: 'danger', 'data-testid': 'cancel-button', hidden: true, onclick: () => cancel(),
  }, 'Cancel execution');
  const meta = h('dl', { class: 'meta' });
  const createdDd = h('dd');
  const errorBox = h('div', { class: 'exec-error', role: 'alert', 'data-testid': 'detail-error', hidden: true });
  const barFill = h('div', { class: 'fill' });
  const bar = h('div', {
    class: 'progress', 'data-testid': 'progress-bar', role: 'progressbar', 'aria-label': 'Progress',
    'aria-valuemin': 0, 'data-done': 0, 'data-total': 0,
  }, barFill);
  const barText = h('span', { class: 'progress-text' });
  const tabButton = (name, label) => h('button', {
    type: 'button', role: 'tab', class: 'tab', 'data-testid': `tab-${name}`, onclick: () => setTab(name),
  }, label);
  const tabGraph = tabButton('graph', 'Graph');
  const tabEvents = tabButton('events', 'Events');
  const tabTimeline = tabButton('timeline', 'Timeline');

  const zoomLabel = h('span', { class: 'muted zoom-label' });
  const zoomBtn = (label, delta, name) => {
    const b = h('button', { type: 'button', class: 'small', 'aria-label': name }, label);
    b.addEventListener('click', () => {
      zoomAt = delta ? Math.min(ZOOMS.length - 1, Math.max(0, zoomAt + delta)) : ZOOMS.indexOf(1);
      applyZoom();
    });
    return b;
  };
  const graphBox = h('div', { class: 'graph-scroll' }, h('p', { class: 'muted pad' }, 'Loading graph…'));
  const panel = h('aside', { class: 'step-panel', 'data-testid': 'step-panel', tabindex: -1, 'aria-label': 'Step details', hidden: true });
  const graphPane = h('div', { class: 'graph-pane', role: 'tabpanel' },
    h('div', { class: 'graph-tools' },
      zoomBtn('−', -1, 'Zoom out'), zoomLabel, zoomBtn('+', 1, 'Zoom in'), zoomBtn('Reset', 0, 'Reset zoom'),
      h('span', { class: 'spacer' }),
      h('span', { class: 'legend' }, LEGEND.map((s) => h('span', { class: `swatch ${statusClass(s)}` }, s)))),
    h('div', { class: 'graph-layout' }, graphBox, panel));
  const eventsPane = h('div', { class: 'events-pane', role: 'tabpanel', hidden: true });
  const timelinePane = h('div', { class: 'timeline-pane', role: 'tabpanel', hidden: true });

  root.append(h('section', { class: 'detail-view' },
    h('a', { href: '/ui/executions', class: 'back' }, '← Executions'),
    h('div', { class: 'detail-head' },
      h('div', { class: 'title-row' }, h('h1', { class: 'mono exec-id' }, id), status, h('span', { class: 'spacer' }), cancelBtn),
      meta, errorBox,
      h('div', { class: 'progress-row' }, bar, barText)),
    h('div', { class: 'tabs', role: 'tablist', 'aria-label': 'Views' }, tabGraph, tabEvents, tabTimeline),
    graphPane, eventsPane, timelinePane));

  function readQuery() {
    const q = new URLSearchParams(location.search);
    tab = ['events', 'timeline'].includes(q.get('tab')) ? q.get('tab') : 'graph';
    step = q.get('step') || null;
  }

  function writeQuery() {
    const q = new URLSearchParams(location.search);
    q.set('tab', tab);
    if (step) q.set('step', step); else q.delete('step');
    history.replaceState(null, '', `${location.pathname}?${q}`);
  }

  function applyTab() {
    tabGraph.setAttribute('aria-selected', String(tab === 'graph'));
    tabEvents.setAttribute('aria-selected', String(tab === 'events'));
    graphPane.hidden = tab !== 'graph';
    tabTimeline.setAttribute('aria-selected', String(tab === 'timeline'));
    eventsPane.hidden = tab !== 'events';
    timelinePane.hidden = tab !== 'timeline';
    if (tab === 'timeline') {
      if (!timeline) {
        timeline = timelineView(id);
        timelinePane.append(timeline.el);
      }
      timeline.start();
    } else if (timeline) timeline.stop();
    if (tab === 'events') {
      if (!events) {
        events = eventsView(log);
        eventsPane.append(events.el);
      }
      log.start();
    }
  }

  function setTab(next) {
    tab = next;
    writeQuery();
    applyTab();
  }

  function applyZoom() {
    setText(zoomLabel, `${Math.round(ZOOMS[zoomAt] * 100)}%`);
    if (graph) graph.zoom(ZOOMS[zoomAt]);
  }

  function selectStep(name) {
    step = name;
    writeQuery();
    if (graph) graph.select(step);
    panelSig = '';
    renderPanel();
    if (step) log.start();
  }

  function renderMeta(s) {
    const pb = s.playbook || {};
    const end = TERMINAL.has(s.status) ? s.updated : Math.floor(Date.now() / 1000);
    const sig = JSON.stringify([pb.path, pb.version, pb.file, s.parent_execution_id, s.created, end]);
    if (sig !== metaSig) {
      metaSig = sig;
      createdDd.title = absTime(s.created);
      meta.replaceChildren(
        h('dt', null, 'Playbook'),
        h('dd', { title: pb.file || null }, pb.path ?? '—', pb.version != null ? h('span', { class: 'muted' }, ` v${pb.version}`) : null),
        h('dt', null, 'Created'), createdDd,
        h('dt', null, 'Duration'), h('dd', null, duration(Math.max(0, end - s.created))),
        h('dt', null, 'Parent'),
        h('dd', null, s.parent_execution_id != null ? execLink(String(s.parent_execution_id)) : '—'));
    }
    setText(createdDd, s.created != null ? `${absTime(s.created)} (${relTime(s.created)})` : '—');
  }

  function render() {
    const s = summary;
    setBadge(status, s.status);
    document.title = `${s.status} · ${id} · flowtide`;
    renderMeta(s);
    const err = s.error;
    errorBox.hidden = !err;
    if (err) {
      fill(errorBox,
        h('strong', null, err.step ? `Step ${err.step} failed` : 'Execution failed'),
        err.kind ? h('span', { class: 'muted' }, ` (${err.kind})`) : null, ': ',
        h('span', null, err.message ?? JSON.stringify(err)));
    }
    const p = s.progress || {};
    const iter = p.iterations > 0;
    const done = Number((iter ? p.iterations_done : p.steps_finished) || 0);
    const total = Number((iter ? p.iterations : p.steps) || 0);
    bar.dataset.done = String(done);
    bar.dataset.total = String(total);
    bar.setAttribute('aria-valuenow', String(done));
    bar.setAttribute('aria-valuemax', String(total));
    bar.className = `progress ${statusClass(s.status)}`;
    barFill.style.width = `${total > 0 ? Math.min(100, (100 * done) / total) : 0}%`;
    setText(barText, iter
      ? `${done} / ${total} iterations${p.iterations_failed ? ` · ${p.iterations_failed} failed` : ''} · ${p.steps_finished ?? 0} / ${p.steps ?? 0} steps`
      : `${done} / ${total} steps`);
    cancelBtn.hidden = !(s.status === 'running' || s.status === 'pending');
    if (!graph && s.graph && Array.isArray(s.graph.nodes)) {
      graph = buildGraph(s.graph, selectStep);
      graphBox.replaceChildren(graph.el);
      applyZoom();
      graph.select(step);
    } else if (!graph) {
      graphBox.replaceChildren(h('p', { class: 'muted pad' }, 'No graph for this execution.'));
    }
    if (graph) graph.update(s);
    renderPanel();
  }

  function renderPanel() {
    if (!step || !summary) {
      panel.hidden = true;
      panel.replaceChildren();
      return;
    }
    const node = graph ? graph.nodes.get(step) : null;
    const st = (summary.steps || {})[step] || { status: 'pending', runs: 0 };
    const evs = log.byStep.get(step) || [];
    const sig = `${JSON.stringify(st)}|${evs.length}|${log.caughtUp}`;
    if (sig === panelSig) return;
    panelSig = sig;
    const hadFocus = panel.contains(document.activeElement);
    const close = h('button', {
      type: 'button', class: 'icon', 'aria-label': 'Close step details', 'data-testid': 'step-panel-close',
      onclick: () => selectStep(null),
    }, '×');
    const when = (t) => (t != null ? absTime(t) : '—');
    const rows = [
      ['Status', badge(st.status || 'pending')],
      ['Kind', node ? node.kind || '—' : '—'],
      ['Runs', String(st.runs ?? 0)],
      ['Started', when(st.started)],
      ['Ended', when(st.ended)],
      ['Duration', duration(st.duration)],
    ];
    if (node && node.loop) rows.push(['Loop', `${node.loop.mode || ''} over ${node.loop.iterator ?? '?'}`]);
    const L = st.loop;
    if (L) {
      rows.push(['Iterations', `${L.done}/${L.cursor && !L.total ? '?' : L.total} done`]);
      rows.push(['Outcome', `${L.succeeded} succeeded · ${L.failed} failed · ${L.in_flight} in flight${L.finished ? ' · finished' : ''}`]);
    }
    if (node && node.line != null) rows.push(['Defined at', `playbook line ${node.line}`]);
    const parts = [
      h('header', { class: 'panel-head' }, h('h2', { class: 'mono' }, step), close),
      node && node.desc ? h('p', { class: 'desc' }, node.desc) : null,
      node ? null : h('p', { class: 'muted' }, 'This step is not in the graph.'),
      h('dl', { class: 'kv' }, rows.flatMap(([k, v]) => [h('dt', null, k), h('dd', null, v)])),
    ];
    if (st.error) {
      const e = st.error;
      const meta2 = [e.kind ? `kind: ${e.kind}` : '', node && node.line != null ? `playbook line ${node.line}` : '']
        .filter(Boolean).join(' · ');
      parts.push(h('div', { class: 'step-error', 'data-testid': 'step-error' },
        h('div', { class: 'err-msg' }, e.message ?? 'failed'),
        meta2 ? h('div', { class: 'err-meta' }, meta2) : null));
      if (Object.keys(e).some((k) => k !== 'message' && k !== 'kind')) {
        const det = h('details', { class: 'err-details', open: errorDetailsOpen },
          h('summary', null, 'Error details'), h('pre', { class: 'json' }, JSON.stringify(e, null, 2)));
        det.addEventListener('toggle', () => { errorDetailsOpen = det.open; });
        parts.push(det);
      }
    }
    const shown = evs.slice(-STEP_EVENTS_SHOWN);
    parts.push(h('h3', null, `Events (${evs.length}${log.caughtUp ? '' : ' so far'})`));
    if (evs.length > shown.length) parts.push(h('p', { class: 'muted small' }, `The last ${shown.length}; the Events tab has all.`));
    parts.push(shown.length
      ? h('table', { class: 'grid compact step-events' },
        h('tbody', null, shown.flatMap((ev) => eventRows(ev, stepExpanded, { compact: true }))))
      : h('p', { class: 'muted small' }, log.caughtUp ? 'No events for this step.' : 'Loading events…'));
    panel.hidden = false;
    fill(panel, parts);
    if (hadFocus) panel.focus({ preventScroll: true });
  }

  function notFound(text) {
    root.replaceChildren(h('section', { class: 'empty-page' },
      h('h1', null, 'Execution not found'), h('p', { class: 'mono' }, id), h('p', { class: 'muted' }, text),
      h('a', { href: '/ui/executions' }, '← Executions')));
  }

  async function refresh() {
    try {
      const s = await api(`/api/executions/${enc(id)}/summary`);
      if (dead) return false;
      summary = s;
      render();
      return !TERMINAL.has(s.status);
    } catch (err) {
      if (dead || err.status === 401) return false;
      if (err.status === 404) {
        log.stop();
        notFound(err.message);
        return false;
      }
      message(`Could not load the execution: ${err.message}`);
      return true;
    }
  }

  async function cancel() {
    cancelBtn.disabled = true;
    try {
      await api(`/api/executions/${enc(id)}/cancel`, { method: 'POST', body: { reason: 'cancelled from the UI' } });
      message('Cancel requested.', 'info');
      poller.kick();
    } catch (err) {
      if (err.status !== 401) message(err.status === 403 ? `Not allowed: ${err.message}` : `Cancel failed: ${err.message}`);
    } finally {
      cancelBtn.disabled = false;
    }
  }

  readQuery();
  applyTab();
  applyZoom();
  if (step) log.start();
  log.subscribe(() => { if (step) renderPanel(); });
  document.title = `${id} · flowtide`;
  const poller = new Poller(refresh, 1000).start();

  return {
    update() {
      readQuery();
      applyTab();
      if (graph) graph.select(step);
      panelSig = '';
      renderPanel();
      if (step) log.start();
    },
    destroy() {
      dead = true;
      poller.stop();
      log.stop();
      if (events) events.destroy();
      if (timeline) timeline.destroy();
    },
  };
}
