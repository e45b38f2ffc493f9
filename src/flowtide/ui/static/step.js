// The parts of the step panel read from GET /api/executions/{id}/steps/{step}: where the
// step is defined (its YAML with line numbers), its result, its last calls and, for a Spark
// step, the session, the output and the dataset's schema and first rows; and its logs,
// followed live from GET /api/executions/{id}/logs?step=&follow=true while it runs.
import { h, duration, clockTime, absTime } from './util.js';
import { openStream, enc } from './api.js';

/** Results up to this many bytes of JSON are shown unfolded. */
const OPEN_RESULT_BYTES = 2048;

const bytes = (n) => {
  const v = Number(n);
  if (!Number.isFinite(v)) return '?';
  if (v < 1024) return `${v} bytes`;
  if (v < 1024 * 1024) return `${(v / 1024).toFixed(1)} KiB (${v.toLocaleString('en-US')} bytes)`;
  return `${(v / 1024 / 1024).toFixed(1)} MiB (${v.toLocaleString('en-US')} bytes)`;
};

const count = (n) => (n == null || !Number.isFinite(Number(n)) ? String(n ?? '—') : Number(n).toLocaleString('en-US'));
const ms = (v) => (v == null || !Number.isFinite(Number(v)) ? '—' : duration(Number(v) / 1000));

/** `file:line` of a step (either may be missing). */
export function where(doc) {
  if (!doc) return '';
  if (doc.file && doc.line != null) return `${doc.file}:${doc.line}`;
  if (doc.line != null) return `playbook line ${doc.line}`;
  return doc.file || '';
}

/** An http(s) URL to link to, or null (never a javascript: or data: one). */
function safeUrl(text) {
  if (typeof text !== 'string' || !text) return null;
  try {
    const url = new URL(text);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
  } catch {
    return null;
  }
}

/** A <details> whose open state survives re-renders (kept in `open` by key). */
function foldable(open, key, defaultOpen, attrs, summary, ...body) {
  const det = h('details', { ...attrs, open: open.has(key) ? open.get(key) : defaultOpen }, h('summary', null, summary), ...body);
  det.addEventListener('toggle', () => open.set(key, det.open));
  return det;
}

/** The step's YAML lines, numbered from `line`. */
export function sourceBlock(source, line) {
  const lines = String(source).replace(/\n$/, '').split('\n');
  const first = Number.isInteger(line) && line > 0 ? line : 1;
  const width = String(first + lines.length - 1).length;
  return h('pre', { class: 'source', 'data-testid': 'step-source', 'data-line': first },
    lines.map((text, i) => h('span', { class: 'src-line' },
      h('span', { class: 'ln', 'aria-hidden': 'true' }, String(first + i).padStart(width, ' ')),
      text, '\n')));
}

function resultBlock(doc, open) {
  if (doc.result_truncated) {
    return h('p', { class: 'muted result-big', 'data-testid': 'step-result', 'data-truncated': 'true' },
      `result too large: ${bytes(doc.result_size)}`);
  }
  if (doc.result == null) {
    const text = ['pending', 'running'].includes(doc.status) ? 'No result yet.' : 'No result.';
    return h('p', { class: 'muted small', 'data-testid': 'step-result', 'data-empty': 'true' }, text);
  }
  const size = doc.result_size != null ? ` · ${bytes(doc.result_size)}` : '';
  // A Spark step's result is the dataset reference the Spark section shows: folded.
  return foldable(open, 'result', !doc.spark && (doc.result_size ?? 0) <= OPEN_RESULT_BYTES,
    { class: 'result', 'data-testid': 'step-result' },
    `Result${size}`, h('pre', { class: 'json' }, JSON.stringify(doc.result, null, 2)));
}

function callsTable(calls) {
  return h('div', { class: 'table-wrap' }, h('table', { class: 'grid compact calls', 'data-testid': 'step-calls' },
    h('thead', null, h('tr', null, ['Time', 'Task', 'Try', 'Took', 'Error'].map((t) => h('th', null, t)))),
    h('tbody', null, calls.map((c) => {
      const failed = c.type === 'call.error' || c.error != null;
      const err = c.error == null ? '' : typeof c.error === 'string' ? c.error : (c.error.message ?? JSON.stringify(c.error));
      return h('tr', { 'data-testid': 'step-call', 'data-type': c.type ?? '', class: failed ? 'call-failed' : null },
        h('td', { class: 'mono nowrap', title: absTime(c.time) }, clockTime(c.time)),
        h('td', { class: 'mono' }, c.task ?? ''),
        h('td', { class: 'num' }, c.attempt ?? ''),
        h('td', { class: 'num nowrap' }, ms(c.duration_ms)),
        h('td', { class: 'call-error' }, err));
    }))));
}

function cell(value) {
  if (value === null || value === undefined) return h('td', { class: 'null' }, 'null');
  if (typeof value === 'object') return h('td', { class: 'mono' }, JSON.stringify(value));
  return h('td', { class: typeof value === 'number' ? 'num' : null }, String(value));
}

function sparkSection(sp, open) {
  const link = safeUrl(sp.ui_url);
  const jobs = Array.isArray(sp.jobs)
    ? `${sp.jobs.length}${sp.jobs.length ? ` (${sp.jobs.slice(0, 12).join(', ')}${sp.jobs.length > 12 ? ', …' : ''})` : ''}`
    : sp.jobs;
  const rows = [
    ['Master', sp.master && h('span', { class: 'mono' }, sp.master)],
    ['Mode', sp.mode],
    ['App id', sp.app_id && h('span', { class: 'mono' }, sp.app_id)],
    ['Version', sp.version],
    ['Spark UI', link
      ? h('a', { href: link, target: '_blank', rel: 'noopener noreferrer', 'data-testid': 'spark-ui-link' }, sp.ui_url)
      : sp.ui_url],
    ['Jobs', jobs],
    ['Rows written', sp.rows_written != null ? count(sp.rows_written) : null],
    ['Row count', sp.row_count != null && sp.row_count !== sp.rows_written ? count(sp.row_count) : null],
    ['Output', sp.uri && h('span', { class: 'mono' }, sp.uri)],
    ['Format', sp.format],
    ['Duration', sp.duration_ms != null ? ms(sp.duration_ms) : null],
  ].filter(([, v]) => v != null && v !== '');
  const schema = Array.isArray(sp.schema) ? sp.schema : [];
  const preview = Array.isArray(sp.preview) ? sp.preview : [];
  // The preview's columns: the schema's, in order (else the keys of its rows).
  let cols = schema.map((c) => String(c.name));
  if (!cols.length) {
    const seen = new Set();
    for (const r of preview) if (r && typeof r === 'object') for (const k of Object.keys(r)) seen.add(k);
    cols = [...seen];
  }
  const parts = [
    h('h3', null, 'Spark'),
    h('dl', { class: 'kv' }, rows.flatMap(([k, v]) => [h('dt', null, k), h('dd', null, v)])),
  ];
  parts.push(foldable(open, 'schema', true, { class: 'spark-block' }, `Schema (${schema.length} column${schema.length === 1 ? '' : 's'})`,
    schema.length
      ? h('div', { class: 'table-wrap' }, h('table', { class: 'grid compact', 'data-testid': 'spark-schema' },
        h('thead', null, h('tr', null, h('th', null, 'Name'), h('th', null, 'Type'))),
        h('tbody', null, schema.map((c) => h('tr', null,
          h('td', { class: 'mono' }, String(c.name ?? '')), h('td', { class: 'mono muted' }, String(c.type ?? '')))))))
      : h('p', { class: 'muted small', 'data-testid': 'spark-schema' }, 'No schema.')));
  const total = sp.row_count ?? sp.rows_written;
  parts.push(foldable(open, 'preview', true, { class: 'spark-block' },
    `Preview (${preview.length}${total != null && total > preview.length ? ` of ${count(total)}` : ''} row${preview.length === 1 ? '' : 's'})`,
    preview.length
      ? h('div', { class: 'table-wrap preview-wrap' }, h('table', { class: 'grid compact preview', 'data-testid': 'spark-preview' },
        h('thead', null, h('tr', null, cols.map((c) => h('th', { class: 'mono' }, c)))),
        h('tbody', null, preview.map((r) => h('tr', null,
          cols.map((c) => cell(r && typeof r === 'object' ? r[c] : null)))))))
      : h('p', { class: 'muted small', 'data-testid': 'spark-preview' }, 'No rows.')));
  return h('section', { class: 'spark', 'data-testid': 'spark-panel' }, parts);
}

/**
 * The panel's sections from a step document. `open` (a Map) keeps which folds the user
 * opened or closed across refreshes.
 */
export function stepDetailParts(doc, open) {
  const parts = [];
  if (doc.source) {
    const n = String(doc.source).replace(/\n$/, '').split('\n').length;
    parts.push(h('h3', null, 'Definition'),
      foldable(open, 'source', true, { class: 'source-fold' },
        h('span', { 'data-testid': 'step-where' }, `YAML · ${n} line${n === 1 ? '' : 's'} · `, h('span', { class: 'mono' }, where(doc))),
        sourceBlock(doc.source, doc.line)));
  }
  parts.push(h('h3', null, 'Result'), resultBlock(doc, open));
  if (doc.spark) parts.push(sparkSection(doc.spark, open));
  parts.push(logsSection(doc));
  const calls = Array.isArray(doc.calls) ? doc.calls : [];
  if (calls.length) {
    parts.push(h('h3', null, `Last calls (${calls.length})`), callsTable(calls));
  }
  // The newest failed call's rendered input (kept by the worker for failed calls only).
  const failed = calls.find((c) => c.meta && c.meta.input !== undefined);
  if (failed) {
    const input = failed.meta.input;
    const big = input && typeof input === 'object' && input.truncated === true;
    parts.push(h('h3', null, 'Input of the failed call'),
      big
        ? h('p', { class: 'muted small', 'data-testid': 'step-input', 'data-truncated': 'true' },
          `input too large to keep: ${bytes(input.bytes)}${Array.isArray(input.keys) ? ` · keys: ${input.keys.join(', ')}` : ''}`)
        : foldable(open, 'input', true, { class: 'result', 'data-testid': 'step-input' },
          `Attempt ${failed.attempt ?? '?'} of ${failed.task ?? 'the task'}`,
          h('pre', { class: 'json' }, JSON.stringify(input, null, 2))));
  }
  return parts;
}

/** Characters of a step's logs the panel keeps (the newest). */
const LOGS_KEPT = 256 * 1024;
/** The Logs section shown, kept across re-renders of the panel: { key, el, pre, state, ctrl, text }. */
let logsView = null;

/** The step's Logs section: one stream per step shown, stopped once the panel moves on. */
function logsSection(doc) {
  const key = `${doc.execution_id}|${doc.step}`;
  if (!logsView || logsView.key !== key) {
    if (logsView) logsView.ctrl.abort();
    const pre = h('pre', { class: 'logs', 'data-testid': 'step-logs' });
    const state = h('span', { class: 'muted small', 'data-testid': 'step-logs-state' }, 'following…');
    const el = h('section', { class: 'step-logs' }, h('h3', null, 'Logs ', state), pre);
    logsView = { key, el, pre, state, ctrl: new AbortController(), text: '' };
    followLogs(logsView, doc);
  }
  return logsView.el;
}

async function followLogs(view, doc) {
  const path = `/api/executions/${enc(doc.execution_id)}/logs?step=${enc(doc.step)}&follow=true`;
  // The section left the page (another step, another view): stop reading.
  const watch = setInterval(() => {
    if (!view.el.isConnected) {
      view.ctrl.abort();
      if (logsView === view) logsView = null;
    }
  }, 2000);
  try {
    const res = await openStream(path, { signal: view.ctrl.signal });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      let add = '';
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (!line.trim()) continue; // keep-alive
        const piece = JSON.parse(line);
        if (piece.dropped) add += `[${piece.dropped} bytes not kept]\n`;
        add += piece.text;
      }
      if (add) appendLogs(view, add);
    }
    view.state.textContent = view.text ? '' : '(nothing printed)';
  } catch (err) {
    if (!view.ctrl.signal.aborted) view.state.textContent = `logs unavailable: ${err.message}`;
  } finally {
    clearInterval(watch);
  }
}

function appendLogs(view, text) {
  const pre = view.pre;
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  view.text += text;
  if (view.text.length > LOGS_KEPT) view.text = view.text.slice(-LOGS_KEPT);
  pre.textContent = view.text;
  if (atEnd) pre.scrollTop = pre.scrollHeight; // following the end, unless scrolled up
}
