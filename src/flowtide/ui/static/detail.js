// One execution: header with status, progress and actions (re-run, resume, cancel), its
// sub-executions and notifications, the Graph tab (with the step panel), the Events tab
// (followed live over SSE) and the Timeline. The summary is polled every second until the
// execution is terminal (2 s while the stream is live; 5 s after it while notifications are owed).
// The step panel reads its step's newest events itself (`/events?step=&newest=true`), so
// opening it never reads the execution's whole log.
import { api, enc } from './api.js';
import {
  h, fill, badge, setBadge, setText, relTime, absTime, duration, execLink, execPath, message, statusClass,
  Poller, TERMINAL, STOPPED,
} from './util.js';
import { buildGraph } from './graph.js';
import { EventLog, eventsView, eventRows } from './events.js';
import { timelineView } from './timeline.js';
import { stepDetailParts, where } from './step.js';
import { triggerBadge } from './list.js';
import { notificationsPanel } from './notifications.js';

/** "3 attempts, 2 retries": a step's task calls and how many were retries. */
export function attemptsText(st) {
  const n = Number(st.attempts) || 0;
  const r = Number(st.retries) || 0;
  return `${n} attempt${n === 1 ? '' : 's'}${r ? `, ${r} retr${r === 1 ? 'y' : 'ies'}` : ''}`;
}

/** The step panel shows its step's newest events, this many. */
const STEP_EVENTS_SHOWN = 50;
const ZOOMS = [0.4, 0.55, 0.7, 0.85, 1, 1.25, 1.5];
const LEGEND = ['pending', 'running', 'completed', 'failed', 'cancelled', 'interrupted', 'skipped'];
/** The step document and events are fetched again at most this often while the step changes. */
const STEP_REFRESH_MS = 2000;
const CHILDREN_REFRESH_MS = 5000;
const OPERATORS = new Set(['operator', 'admin']);

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
  let lastRefresh = 0;
  let errorDetailsOpen = false;
  const stepExpanded = new Set();
  const folds = new Map(); // the step panel's folds the user opened or closed
  // The step panel: built once per step, its parts filled when their data changes.
  let pane = null; // {step, kv, error, detail, events, sigs}
  // The step document (GET .../steps/{step}), fetched again when the step changes.
  const stepDoc = { step: null, doc: null, text: '', err: null, sig: null, busy: false, at: 0, timer: null };
  // The step's newest events: again when the step changes, and while it runs (throttled).
  const stepEvents = { step: null, items: null, err: null, sig: null, busy: false, at: 0, timer: null };
  let children = null; // sub-executions: {items, more}
  let childrenAt = 0;
  let childrenBusy = false;
  let resumed = false; // resumed from this page: the note follows its live status
  const log = new EventLog(id, () => Boolean(summary && TERMINAL.has(summary.status)));

  const status = badge('loading', { 'data-testid': 'detail-status' });
  const cancelBtn = h('button',
    { type: 'button', class: 'danger', 'data-testid': 'cancel-button', hidden: true, onclick: () => cancel() }, 'Cancel execution');
  const rerunBtn = h('button', { type: 'button', 'data-testid': 'rerun-button', hidden: true, onclick: () => rerun(),
    title: 'Start this playbook again with the same workload' }, 'Re-run');
  const resumeBtn = h('button', { type: 'button', 'data-testid': 'resume-button', hidden: true, onclick: () => resume(),
    title: 'Continue this execution in this flowtide ui process' }, 'Resume');
  const actionNote = h('p', { class: 'action-note', 'data-testid': 'action-message', role: 'alert', hidden: true });
  const childrenBox = h('section', { class: 'children', 'data-testid': 'children', hidden: true });
  const notes = notificationsPanel();
  const meta = h('dl', { class: 'meta' });
  const createdDd = h('dd');
  const errorBox = h('div', { class: 'exec-error', role: 'alert', 'data-testid': 'detail-error', hidden: true });
  const barFill = h('div', { class: 'fill' });
  const bar = h('div', {
    class: 'progress', 'data-testid': 'progress-bar', role: 'progressbar', 'aria-label': 'Progress',
    'aria-valuemin': 0, 'data-done': 0, 'data-total': 0,
  }, barFill);
  const barText = h('span', { class: 'progress-text' });
  const tabButton = (name, label) => h('button',
    { type: 'button', role: 'tab', class: 'tab', 'data-testid': `tab-${name}`, onclick: () => setTab(name) }, label);
  const [tabGraph, tabEvents, tabTimeline] = [['graph', 'Graph'], ['events', 'Events'], ['timeline', 'Timeline']]
    .map(([name, label]) => tabButton(name, label));

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
      h('div', { class: 'title-row' }, h('h1', { class: 'mono exec-id' }, id), status, h('span', { class: 'spacer' }),
        rerunBtn, resumeBtn, cancelBtn),
      actionNote, meta, errorBox,
      h('div', { class: 'progress-row' }, bar, barText)),
    childrenBox, notes.el,
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
    renderPanel();
  }

  function renderMeta(s) {
    const pb = s.playbook || {};
    const end = STOPPED.has(s.status) ? s.updated : Math.floor(Date.now() / 1000);
    const sig = JSON.stringify([pb.path, pb.version, pb.file, s.parent_execution_id, s.trigger, s.created, end]);
    if (sig !== metaSig) {
      metaSig = sig;
      createdDd.title = absTime(s.created);
      fill(meta,
        h('dt', null, 'Playbook'),
        h('dd', { title: pb.file || null }, pb.path ?? '—', pb.version != null ? h('span', { class: 'muted' }, ` v${pb.version}`) : null),
        h('dt', null, 'Created'), createdDd,
        h('dt', null, 'Duration'), h('dd', null, duration(Math.max(0, end - s.created))),
        s.trigger ? [h('dt', null, 'Started by'), h('dd', null, triggerBadge(s.trigger))] : null,
        s.parent_execution_id != null ? [
          h('dt', null, 'Parent'),
          h('dd', null, execLink(String(s.parent_execution_id), { 'data-testid': 'parent-link', title: 'The execution that started this one' })),
        ] : null);
    }
    setText(createdDd, s.created != null ? `${absTime(s.created)} (${relTime(s.created)})` : '—');
  }

  // One state per page: the banner says what the badge says (failed, cancelled, interrupted).
  function renderBanner(s) {
    const err = s.error;
    const kind = s.status === 'failed' || s.status === 'cancelled' || s.status === 'interrupted' ? s.status : null;
    errorBox.hidden = !kind || (kind !== 'interrupted' && !err);
    errorBox.className = `exec-error ${statusClass(kind || 'failed')}`;
    errorBox.dataset.status = kind || '';
    if (errorBox.hidden) return;
    if (kind === 'interrupted') {
      // A spark loop's items are one command: what its job did before it stopped is not kept.
      const sparks = Object.entries(s.steps || {})
        .filter(([, st]) => st.status === 'interrupted' && st.loop && st.loop.exact === false)
        .map(([name]) => name);
      fill(errorBox, h('strong', null, 'Interrupted'), ': the process running it went away before it ended.',
        ' Resume carries it on from its log (finished steps and iterations are kept), as ',
        h('span', { class: 'mono' }, `flowtide resume ${id}`), ' does.',
        sparks.length ? h('span', { 'data-testid': 'spark-loops-again' },
          ` Spark loop ${sparks.join(', ')}: its job stopped before its end, a resume runs all its items again.`) : null);
      return;
    }
    const title = kind === 'cancelled' ? 'Cancelled' : err.step ? `Step ${err.step} failed` : 'Execution failed';
    const why = err.message ?? JSON.stringify(err);
    fill(errorBox,
      h('strong', null, title),
      err.kind && err.kind !== kind ? h('span', { class: 'muted' }, ` (${err.kind})`) : null, ': ',
      h('span', null, why));
  }

  function render() {
    const s = summary;
    setBadge(status, s.status);
    document.title = `${s.status} · ${id} · flowtide`;
    renderMeta(s);
    renderBanner(s);
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
    cancelBtn.hidden = !['running', 'pending', 'interrupted'].includes(s.status);
    if (resumed) note(`Resumed here: ${s.status}.`, 'info');
    const me = ctx.me || {};
    rerunBtn.hidden = !OPERATORS.has(me.role);
    const sub = s.parent_execution_id != null;
    rerunBtn.disabled = sub || rerunBtn.dataset.busy === '1';
    rerunBtn.title = sub ? 'A sub-execution is started by its parent: re-run the parent'
      : 'Start this playbook again with the same workload';
    // `flowtide ui` only; not for a run this process is running already (`run_here`).
    resumeBtn.hidden = !(me.local && !['completed', 'failed', 'cancelled'].includes(s.status) && s.run_here !== true);
    if (!graph && s.graph && Array.isArray(s.graph.nodes)) {
      graph = buildGraph(s.graph, selectStep);
      graphBox.replaceChildren(graph.el);
      applyZoom();
      graph.select(step);
    } else if (!graph) {
      graphBox.replaceChildren(h('p', { class: 'muted pad' }, 'No graph for this execution.'));
    }
    if (graph) graph.update(s);
    notes.update(s);
    renderPanel();
  }

  /** The panel's skeleton for `name`: its parts are filled by renderPanel(). */
  function buildPane(name) {
    const close = h('button', {
      type: 'button', class: 'icon', 'aria-label': 'Close step details', 'data-testid': 'step-panel-close',
      onclick: () => selectStep(null),
    }, '×');
    pane = {
      step: name,
      desc: h('div'),
      kv: h('dl', { class: 'kv' }),
      error: h('div'),
      detail: h('div', { class: 'step-detail', 'data-testid': 'step-detail', 'aria-live': 'polite' }),
      events: h('div'),
      sigs: {},
    };
    panel.dataset.step = name;
    fill(panel, h('header', { class: 'panel-head' }, h('h2', { class: 'mono' }, name), close),
      pane.desc, pane.kv, pane.error, pane.detail, pane.events);
  }

  /** Fills a part of the panel when its signature changed (keeping the focus nearby). */
  function part(key, sig, node, build) {
    if (pane.sigs[key] === sig) return;
    pane.sigs[key] = sig;
    const hadFocus = node.contains(document.activeElement);
    fill(node, build());
    if (hadFocus) panel.focus({ preventScroll: true });
  }

  function renderPanel() {
    if (!step || !summary) {
      panel.hidden = true;
      if (!step) {
        panel.replaceChildren();
        pane = null;
      }
      return;
    }
    if (!pane || pane.step !== step) buildPane(step);
    panel.hidden = false;
    wantStepDoc();
    wantStepEvents();
    const node = graph ? graph.nodes.get(step) : null;
    const st = (summary.steps || {})[step] || { status: 'pending', runs: 0 };
    const doc = stepDoc.step === step ? stepDoc.doc : null;
    part('desc', `${Boolean(node)}|${node ? node.desc : ''}`, pane.desc, () => [
      node && node.desc ? h('p', { class: 'desc' }, node.desc) : null,
      node ? null : h('p', { class: 'muted' }, 'This step is not in the graph.'),
    ]);
    const kind = (doc && doc.kind) || (node && node.kind) || '—';
    part('kv', JSON.stringify([st, kind, node ? node.line : null, doc ? where(doc) : '']), pane.kv, () => {
      const when = (t) => (t != null ? absTime(t) : '—');
      const rows = [
        ['Status', badge(st.status || 'pending', { 'data-testid': 'step-status' })],
        ['Kind', kind],
        ['Runs', String(st.runs ?? 0)],
        ['Attempts', h('span', { 'data-testid': 'step-attempts' }, attemptsText(st))],
        ['Started', when(st.started)],
        ['Ended', when(st.ended)],
        ['Duration', duration(st.duration)],
      ];
      if (node && node.loop) rows.push(['Loop', `${node.loop.mode || ''} over ${node.loop.iterator ?? '?'}`]);
      const L = st.loop;
      if (L) {
        // A spark loop's items per second (its progress events).
        const rate = L.per_second ? ` · ${Math.round(L.per_second).toLocaleString('en-US')}/s` : '';
        const n = (x) => Number(x).toLocaleString('en-US');
        rows.push(['Iterations', `${n(L.done)}/${L.cursor && !L.total ? '?' : n(L.total)} done${rate}`]);
        if (L.exact === false) {
          // A spark loop's counts are progress until its job ends (then exact).
          rows.push(['Outcome', h('span', { 'data-testid': 'spark-outcome' }, st.status === 'running' || st.status === 'pending'
            ? 'counted as its job ends'
            : 'its job stopped before its end: a resume runs all its items again')]);
        } else {
          rows.push(['Outcome', `${L.succeeded} succeeded · ${L.failed} failed · ${L.in_flight} in flight${L.finished ? ' · finished' : ''}`]);
        }
      }
      const at = doc ? where(doc) : node && node.line != null ? `playbook line ${node.line}` : '';
      if (at) rows.push(['Defined at', h('span', { class: 'mono' }, at)]);
      return rows.flatMap(([k, v]) => [h('dt', null, k), h('dd', null, v)]);
    });
    const err = st.error || (doc && doc.error) || null;
    part('error', JSON.stringify([err, doc ? where(doc) : '', node ? node.line : null]), pane.error, () => {
      if (!err) return null;
      const e = typeof err === 'object' ? err : { message: String(err) };
      const at = doc ? where(doc) : node && node.line != null ? `playbook line ${node.line}` : '';
      const meta2 = [e.kind ? `kind: ${e.kind}` : '', at].filter(Boolean).join(' · ');
      const out = [h('div', { class: 'step-error', 'data-testid': 'step-error' },
        h('div', { class: 'err-msg' }, e.message ?? 'failed'),
        meta2 ? h('div', { class: 'err-meta mono', 'data-testid': 'step-error-where' }, meta2) : null)];
      if (Object.keys(e).some((k) => k !== 'message' && k !== 'kind')) {
        const det = h('details', { class: 'err-details', open: errorDetailsOpen },
          h('summary', null, 'Error details'), h('pre', { class: 'json' }, JSON.stringify(e, null, 2)));
        det.addEventListener('toggle', () => { errorDetailsOpen = det.open; });
        out.push(det);
      }
      return out;
    });
    const errSig = stepDoc.err ? `${stepDoc.err.status}|${stepDoc.err.message}` : '';
    part('detail', `${stepDoc.step === step ? stepDoc.text : ''}|${errSig}|${st.status}`, pane.detail, () => {
      if (stepDoc.step !== step) return null;
      if (doc) return stepDetailParts(doc, folds);
      const e = stepDoc.err;
      if (!e) return h('p', { class: 'muted small' }, 'Loading step details…');
      if (e.status === 404 && (st.status || 'pending') === 'pending') {
        return h('p', { class: 'muted small' }, 'Not run yet: no result, calls or source to show.');
      }
      return h('p', { class: 'muted small', 'data-testid': 'step-detail-error' }, `Step details unavailable: ${e.message}`);
    });
    const items = stepEvents.step === step ? stepEvents.items : null;
    const evErr = stepEvents.step === step && stepEvents.err ? stepEvents.err.message : '';
    const evSig = items ? `${items.length}|${items.map((ev) => ev.event_id).join(',')}` : '';
    part('events', `${evSig}|${evErr}`, pane.events, () => {
      if (!items) {
        return [h('h3', null, 'Events'), evErr
          ? h('p', { class: 'muted small', 'data-testid': 'step-events-error' }, `Events unavailable: ${evErr}`)
          : h('p', { class: 'muted small' }, 'Loading events…')];
      }
      const more = items.length >= STEP_EVENTS_SHOWN;
      return [
        h('h3', null, more ? `Events (the last ${items.length})` : `Events (${items.length})`),
        items.length > 1
          ? h('p', { class: 'muted small' }, `Newest first${more ? '; the Events tab has the whole log' : ''}.`)
          : null,
        items.length
          ? h('table', { class: 'grid compact step-events', 'data-testid': 'step-events', 'data-step': step },
            h('tbody', null, items.slice().reverse().flatMap((ev) => eventRows(ev, stepExpanded, { compact: true }))))
          : h('p', { class: 'muted small', 'data-testid': 'step-events' }, 'No events for this step.'),
      ];
    });
  }

  /**
   * Fetches the step's newest events when the step is new or its summary changed, and
   * while it runs on the summary's refreshes: at most every 2 s.
   */
  function wantStepEvents() {
    if (!step || !summary || dead) return;
    const st = (summary.steps || {})[step] || null;
    const sig = `${step}|${JSON.stringify(st)}|${summary.status}`;
    const same = stepEvents.step === step;
    const running = !TERMINAL.has(summary.status) && Boolean(st) && st.status === 'running';
    const stale = Date.now() - stepEvents.at >= STEP_REFRESH_MS;
    if (same && stepEvents.sig === sig && !(running && stale)) return;
    if (stepEvents.busy) return; // looked at again when the fetch in flight returns
    clearTimeout(stepEvents.timer);
    const wait = same ? STEP_REFRESH_MS - (Date.now() - stepEvents.at) : 0;
    if (wait > 0) {
      stepEvents.timer = setTimeout(wantStepEvents, wait);
      return;
    }
    loadStepEvents(step, sig);
  }

  async function loadStepEvents(name, sig) {
    if (stepEvents.step !== name) Object.assign(stepEvents, { items: null, err: null });
    Object.assign(stepEvents, { step: name, sig, busy: true, at: Date.now() });
    try {
      const items = await api(`/api/executions/${enc(id)}/events?step=${enc(name)}&newest=true&limit=${STEP_EVENTS_SHOWN}`);
      if (dead) return;
      if (stepEvents.step === name) Object.assign(stepEvents, { items: Array.isArray(items) ? items : [], err: null });
    } catch (err) {
      if (dead || err.status === 401) return;
      if (stepEvents.step === name) stepEvents.err = err;
    } finally {
      stepEvents.busy = false;
    }
    if (step === name) renderPanel();
    else wantStepEvents();
  }

  /** Fetches the step document when the step is new or changed (at most every 2 s). */
  function wantStepDoc() {
    if (!step || !summary || dead) return;
    const st = (summary.steps || {})[step] || null;
    const sig = `${step}|${JSON.stringify(st)}|${summary.status}`;
    if (stepDoc.step === step && stepDoc.sig === sig) return;
    if (stepDoc.busy) return; // looked at again when the fetch in flight returns
    clearTimeout(stepDoc.timer);
    const wait = stepDoc.step === step ? STEP_REFRESH_MS - (Date.now() - stepDoc.at) : 0;
    if (wait > 0) {
      stepDoc.timer = setTimeout(wantStepDoc, wait);
      return;
    }
    loadStepDoc(step, sig);
  }

  async function loadStepDoc(name, sig) {
    if (stepDoc.step !== name) Object.assign(stepDoc, { doc: null, text: '', err: null });
    Object.assign(stepDoc, { step: name, sig, busy: true, at: Date.now() });
    try {
      const doc = await api(`/api/executions/${enc(id)}/steps/${enc(name)}`);
      if (dead) return;
      if (stepDoc.step === name) Object.assign(stepDoc, { doc, text: JSON.stringify(doc), err: null });
    } catch (err) {
      if (dead || err.status === 401) return;
      if (stepDoc.step === name) stepDoc.err = err;
    } finally {
      stepDoc.busy = false;
    }
    if (step === name) renderPanel();
    else wantStepDoc();
  }

  function renderChildren() {
    const list = children ? children.items : [];
    childrenBox.hidden = list.length === 0;
    if (!list.length) return;
    const now = Math.floor(Date.now() / 1000);
    fill(childrenBox,
      h('h3', null, `Sub-executions (${list.length}${children.more ? '+' : ''})`),
      h('div', { class: 'table-wrap' }, h('table', { class: 'grid compact children-table', 'data-testid': 'children-table' },
        h('thead', null, h('tr', null, ['ID', 'Playbook', 'Status', 'Created', 'Duration'].map((t) => h('th', null, t)))),
        h('tbody', null, list.map((it) => {
          const cid = String(it.execution_id);
          const end = TERMINAL.has(it.status) ? (it.ended ?? it.updated) : now;
          const took = it.duration ?? (it.created != null ? Math.max(0, end - it.created) : null);
          return h('tr', { 'data-testid': 'child-row', 'data-id': cid, 'data-status': it.status ?? '' },
            h('td', null, execLink(cid)),
            h('td', { class: 'playbook' }, it.playbook ?? '—', it.version != null ? h('span', { class: 'muted ver' }, ` v${it.version}`) : null),
            h('td', null, badge(it.status)),
            h('td', { class: 'nowrap', title: absTime(it.created) }, relTime(it.created)),
            h('td', { class: 'num nowrap' }, duration(took)));
        })))),
      children.more
        ? h('p', { class: 'small' }, h('a', { href: `/ui/executions?parent=${enc(id)}` }, 'All sub-executions in the list →'))
        : null);
  }

  async function loadChildren() {
    if (childrenBusy) return;
    childrenBusy = true;
    childrenAt = Date.now();
    try {
      const data = await api(`/api/executions?parent=${enc(id)}&limit=50`);
      if (dead) return;
      // Only this execution's children, even from a server that ignores `parent`.
      const items = ((data && data.items) || []).filter((it) => String(it.parent_execution_id ?? '') === id);
      children = { items, more: Boolean(data && data.next_before != null && items.length >= 50) };
      renderChildren();
    } catch (err) {
      if (!dead && err.status !== 401 && err.status !== 404) console.warn('sub-executions:', err.message);
    } finally {
      childrenBusy = false;
    }
  }

  function notFound(text) {
    root.replaceChildren(h('section', { class: 'empty-page' },
      h('h1', null, 'Execution not found'), h('p', { class: 'mono' }, id), h('p', { class: 'muted' }, text),
      h('a', { href: '/ui/executions' }, '← Executions')));
  }

  async function refresh() {
    lastRefresh = Date.now();
    try {
      const s = await api(`/api/executions/${enc(id)}/summary`);
      if (dead) return false;
      const wasTerminal = summary ? TERMINAL.has(summary.status) : null;
      summary = s;
      render();
      const terminal = TERMINAL.has(s.status);
      // Sub-executions: every few seconds while running, and once more at the end.
      if (Date.now() - childrenAt > CHILDREN_REFRESH_MS || (terminal && wasTerminal === false)) loadChildren();
      // Deliveries come after the end: read them until none is owed.
      if (terminal && s.notifications_owed > 0) poller.ms = 5000;
      return !terminal || s.notifications_owed > 0;
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

  function note(text, kind = 'error') {
    actionNote.hidden = !text;
    actionNote.className = `action-note ${kind}`;
    setText(actionNote, text || '');
  }

  async function cancel() {
    cancelBtn.disabled = true;
    note('');
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

  async function rerun() {
    rerunBtn.disabled = true;
    rerunBtn.dataset.busy = '1';
    note('');
    try {
      const r = await api(`/api/executions/${enc(id)}/rerun`, { method: 'POST', body: {} });
      if (dead) return;
      message(`Started execution ${r.execution_id}, a re-run of ${id}.`, 'info');
      ctx.navigate(execPath(String(r.execution_id)));
    } catch (err) {
      if (dead || err.status === 401) return;
      note(err.status === 403 ? `Not allowed: ${err.message}` : `Re-run failed: ${err.message}`);
    } finally {
      delete rerunBtn.dataset.busy;
      if (!dead && summary) render();
    }
  }

  async function resume() {
    resumeBtn.disabled = true;
    note('');
    try {
      const r = await api(`/api/executions/${enc(id)}/resume`, { method: 'POST', body: {} });
      if (dead) return;
      resumed = true;
      note(`Resumed here: ${r && r.status ? r.status : 'running'}.`, 'info');
      if (poller.stopped) poller.start(); else poller.kick();
      log.revive();
      if (timeline) timeline.start();
    } catch (err) {
      if (dead || err.status === 401) return;
      note(err.status === 409 ? err.message : `Resume failed: ${err.message}`);
    } finally {
      resumeBtn.disabled = false;
    }
  }

  // Escape in the step panel closes it and goes back to its node.
  panel.addEventListener('keydown', (ev) => {
    if (ev.key !== 'Escape' || !step) return;
    ev.preventDefault();
    const name = step;
    selectStep(null);
    const node = graphBox.querySelector(`[data-testid="graph-node"][data-step="${CSS.escape(name)}"]`);
    if (node) node.focus();
  });

  readQuery();
  applyTab();
  applyZoom();
  log.subscribe(() => {
    // While the stream is live its batches drive the refreshes (at most one a second).
    poller.ms = log.mode === 'live' ? 2000 : 1000;
    if (!poller.stopped && Date.now() - lastRefresh >= 1000) poller.kick();
  });
  log.onEnd(() => {
    // The stream says the execution ended: read the summary once more.
    if (poller.stopped) poller.start(); else poller.kick();
  });
  document.title = `${id} · flowtide`;
  const poller = new Poller(refresh, 1000).start();
  loadChildren();

  return {
    update() {
      readQuery();
      applyTab();
      if (graph) graph.select(step);
      renderPanel();
    },
    destroy() {
      dead = true;
      poller.stop();
      log.stop();
      clearTimeout(stepDoc.timer);
      clearTimeout(stepEvents.timer);
      if (events) events.destroy();
      if (timeline) timeline.destroy();
    },
  };
}
