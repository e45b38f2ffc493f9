// The playbook catalog: the registered playbooks (a filterable table), and one playbook by
// version: its YAML with line numbers and its validation errors on their lines, a Run form
// built from its workload defaults, its recent executions, and an editor (operator+) that
// validates the text and registers it as a new version.
import { api, enc } from './api.js';
import { h, fill, badge, setText, relTime, absTime, execLink, execPath, message, Poller } from './util.js';

/** The API refuses a playbook text longer than this (characters). */
export const MAX_CHARS = 4_000_000;
const RANK = { reader: 0, operator: 1, admin: 2 };
/** Starting, registering: operator or admin. */
export const canOperate = (me) => (RANK[me && me.role] ?? -1) >= RANK.operator;

const encPath = (p) => String(p).split('/').map(enc).join('/');
/** The UI address of a catalog path (a version, or the latest one). */
export const catalogPath = (p, version = null) =>
  `/ui/catalog/${encPath(p)}${version != null ? `?version=${enc(version)}` : ''}`;

const TEMPLATE = `apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: my_playbook
  path: playbooks/my_playbook
  description: What this playbook does
workload:
  greeting: hello
  count: 3
workflow:
  - step: start
    desc: Say hello
    tool:
      kind: python
      input:
        greeting: "{{ greeting }}"
        count: "{{ count }}"
      code: |
        result = {"message": ", ".join([greeting] * int(count))}
    next:
      arcs:
        - step: end
  - step: end
    tool:
      kind: noop
`;

/** Lines of the code view per block laid out together. */
const CODE_BLOCK = 200;

// YAML's line breaks (PyYAML's): a line number here is the parser's.
const BREAK = /\r\n|[\n\r\u0085\u2028\u2029]/;

function splitLines(text) {
  const lines = String(text ?? '').split(BREAK);
  if (lines.length > 1 && lines[lines.length - 1] === '') lines.pop();
  return lines;
}

/** Many nodes at once (a spread of 100,000 arguments overflows the stack). */
function fragment(nodes) {
  const f = document.createDocumentFragment();
  for (const n of nodes) f.append(n);
  return f;
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/** An error of the API as {message, line, column, expected} (line null when unknown). */
function normError(e) {
  const line = Number.isInteger(e && e.line) && e.line > 0 ? e.line : null;
  const column = Number.isInteger(e && e.column) && e.column > 0 ? e.column : null;
  const text = (v) => (v == null || v === '' ? null : String(v));
  let msg = String((e && e.message) ?? e ?? 'invalid');
  // The CLI's message starts with file:line:column, which this place says already.
  const at = msg.match(/^(.*?):(\d+)(?::\d+)?: /);
  if (at && line != null && Number(at[2]) === line) msg = msg.slice(at[0].length);
  return {
    message: msg, line, column,
    step: text(e && e.step), field: text(e && (e.playbook_field ?? e.field)), expected: text(e && e.expected),
  };
}

function errorText(e) {
  const where = e.line != null ? `Line ${e.line}${e.column != null ? `, column ${e.column}` : ''}: ` : '';
  // The register error's message is the CLI's (it names the step and field already).
  const field = e.field && e.field !== 'content' ? e.field : null;
  const what = [e.step && !e.message.includes(`'${e.step}'`) ? `step ${e.step}` : null,
    field && !e.message.includes(field) ? field : null].filter(Boolean).join(', ');
  const exp = e.expected && !e.message.includes(e.expected) ? ` (expected ${e.expected})` : '';
  return `${where}${what ? `${what}: ` : ''}${e.message}${exp}`;
}

/** The problems of a 400 from register: error.fields, else the message alone. */
function registerErrors(err) {
  const fields = err && err.body && err.body.error && err.body.error.fields;
  if (Array.isArray(fields) && fields.length) return fields.map(normError);
  return [normError({ message: err.message })];
}

/**
 * The YAML as a code view: one element per line (data-testid="yaml-line-N") with its number,
 * and each error under its line (data-testid="yaml-error"). Errors without a line (or beyond
 * the text) are listed above the code.
 */
function codeView(text, errors = []) {
  const lines = splitLines(text);
  const byLine = new Map();
  const loose = [];
  for (const e of errors.map(normError)) {
    const at = e.line != null ? Math.min(e.line, lines.length) : null;
    if (at == null || at < 1) loose.push(e);
    else byLine.set(at, [...(byLine.get(at) || []), e]);
  }
  const code = h('div', { class: 'code', 'data-testid': 'yaml-view' });
  code.style.setProperty('--ln-width', `${String(lines.length).length + 1}ch`);
  // Lines in blocks the browser lays out only near the view (content-visibility): a
  // 100,000-line text shows at once, and stays searchable with the browser's find.
  const blocks = [];
  for (let at = 0; at < lines.length; at += CODE_BLOCK) {
    const part = lines.slice(at, at + CODE_BLOCK);
    const block = h('ol', { class: 'code-block', start: at + 1 });
    block.style.setProperty('--lines', String(part.length));
    block.append(fragment(part.map((line, i) => {
      const n = at + i + 1;
      const errs = byLine.get(n);
      return h('li', { class: errs ? 'has-error' : null, 'data-testid': `yaml-line-${n}`, 'data-line': n },
        h('span', { class: 'ln', 'aria-hidden': 'true' }, String(n)),
        h('span', { class: 'lc' }, line || ' '),
        errs ? errs.map((e) => h('div', { class: 'code-msg', 'data-testid': 'yaml-error', 'data-line': n, role: 'note' },
          `▲ ${errorText(e)}`)) : null);
    })));
    blocks.push(block);
  }
  code.append(fragment(blocks));
  const head = loose.length
    ? h('ul', { class: 'code-errors' }, loose.map((e) => h('li', { 'data-testid': 'yaml-error' }, errorText(e))))
    : null;
  // Focusable, so that keys scroll it.
  return h('div', { class: 'code-box' }, head,
    h('div', { class: 'code-scroll', tabindex: 0, role: 'region', 'aria-label': 'Playbook YAML' }, code));
}

/**
 * The editor: a textarea with a line-number gutter, Validate, Save as new version and
 * Cancel. onSaved({path, version, catalog_id}) after a registration; onCancel().
 */
function playbookEditor({ text, sourceFile, heading, onSaved, onCancel }) {
  const original = text;
  const ta = h('textarea', {
    class: 'editor-text', 'data-testid': 'editor-text', wrap: 'off', spellcheck: 'false',
    autocapitalize: 'off', autocomplete: 'off', 'aria-label': 'Playbook YAML',
  });
  ta.value = text;
  const nums = h('div', { class: 'editor-nums' });
  const gutter = h('div', { class: 'editor-gutter', 'aria-hidden': 'true' }, nums);
  const source = h('input', {
    type: 'text', id: 'editor-source', class: 'editor-source mono', 'data-testid': 'editor-source',
    placeholder: 'optional, e.g. playbooks/etl.yaml', spellcheck: 'false', autocomplete: 'off',
  });
  source.value = sourceFile || '';
  const status = h('p', { class: 'editor-status', 'data-testid': 'editor-status', role: 'status', 'aria-live': 'polite' });
  const errorList = h('ul', { class: 'editor-errors', 'data-testid': 'editor-errors', hidden: true });
  const validateBtn = h('button', { type: 'button', 'data-testid': 'editor-validate', onclick: () => validate() }, 'Validate');
  const saveBtn = h('button', { type: 'button', class: 'primary', 'data-testid': 'editor-save', onclick: () => save() }, 'Save as new version');
  const cancelBtn = h('button', { type: 'button', 'data-testid': 'editor-cancel', onclick: () => cancel() }, 'Cancel');
  let marks = new Map(); // line -> [error]
  let busy = false;

  const el = h('section', { class: 'editor-box', 'data-testid': 'editor', 'aria-label': heading },
    h('div', { class: 'editor-head' }, h('h2', null, heading), h('span', { class: 'spacer' }),
      h('label', { for: 'editor-source', class: 'muted small' }, 'Source file'), source),
    h('div', { class: 'editor' }, gutter, ta),
    h('div', { class: 'toolbar' }, validateBtn, saveBtn, cancelBtn, h('span', { class: 'spacer' }),
      h('span', { class: 'hint muted' }, 'Ctrl+Enter validates · Ctrl+S saves')),
    status, errorList);

  let total = 1; // lines of the text
  let painted = ''; // the range of line numbers shown

  /** Lines in the text (YAML's count; a textarea's value breaks lines with \n only). */
  function lineCount() {
    let n = 1;
    const v = ta.value;
    for (let i = v.indexOf('\n'); i !== -1; i = v.indexOf('\n', i + 1)) n += 1;
    return n;
  }

  function metrics() {
    const style = getComputedStyle(ta);
    return { lh: parseFloat(style.lineHeight) || 19, pad: parseFloat(style.paddingTop) || 0 };
  }

  /** The numbers of the lines in view only (a long text has 100,000 lines), moved with
   * the textarea's scroll. */
  function paint(force = false) {
    const { lh, pad } = metrics();
    const top = ta.scrollTop;
    const first = Math.min(total - 1, Math.max(0, Math.floor((top - pad) / lh)));
    const last = Math.min(total, first + Math.ceil(ta.clientHeight / lh) + 2);
    const key = `${first}:${last}`;
    if (force || key !== painted) {
      painted = key;
      const divs = [];
      for (let k = first + 1; k <= last; k += 1) {
        const errs = marks.get(k);
        divs.push(h('div', {
          'data-testid': `editor-line-${k}`, 'data-line': k, class: errs ? 'has-error' : null,
          title: errs ? errs.map(errorText).join('\n') : null,
        }, String(k)));
      }
      fill(nums, divs);
    }
    nums.style.transform = `translateY(${pad + first * lh - top}px)`;
  }

  function renderGutter() {
    const n = lineCount();
    if (n !== total) {
      total = n;
      gutter.style.minWidth = `calc(${String(n).length}ch + 18px)`;
      paint(true);
    } else paint();
  }

  const syncScroll = () => paint();

  function setStatus(text, kind = '') {
    status.className = `editor-status${kind ? ` ${kind}` : ''}`;
    status.dataset.kind = kind;
    setText(status, text);
  }

  /** Selects line n in the textarea and scrolls it into view. */
  function selectLine(n) {
    const v = ta.value;
    let start = 0;
    for (let k = 1; k < n; k += 1) {
      const i = v.indexOf('\n', start);
      if (i === -1) break;
      start = i + 1;
    }
    let end = v.indexOf('\n', start);
    if (end === -1) end = v.length;
    ta.focus({ preventScroll: true });
    ta.setSelectionRange(start, end);
    const lh = parseFloat(getComputedStyle(ta).lineHeight) || 18;
    ta.scrollTop = Math.max(0, (n - 1) * lh - ta.clientHeight / 3);
    syncScroll();
  }

  function showErrors(errors) {
    const list = errors.map(normError);
    marks = new Map();
    for (const e of list) if (e.line != null) marks.set(e.line, [...(marks.get(e.line) || []), e]);
    fill(errorList, list.map((e) => h('li', null, e.line != null
      ? h('button', {
        type: 'button', class: 'link-button', 'data-testid': 'editor-error', 'data-line': e.line,
        onclick: () => selectLine(e.line),
      }, errorText(e))
      : h('span', { 'data-testid': 'editor-error' }, errorText(e)))));
    errorList.hidden = list.length === 0;
    paint(true);
  }

  function tooLong() {
    const n = ta.value.length;
    if (n <= MAX_CHARS) return false;
    setStatus(`The text is ${n.toLocaleString('en')} characters: a playbook may have at most ${MAX_CHARS.toLocaleString('en')}.`, 'error');
    return true;
  }

  function body() {
    const b = { content: ta.value };
    const file = source.value.trim();
    if (file) b.source_file = file;
    return b;
  }

  function setBusy(on) {
    busy = on;
    validateBtn.disabled = on;
    saveBtn.disabled = on;
  }

  async function validate() {
    if (busy || tooLong()) return;
    if (!ta.value.trim()) { setStatus('The playbook is empty.', 'error'); return; }
    setBusy(true);
    setStatus('Validating…');
    try {
      const res = await api('/api/catalog/validate', { method: 'POST', body: body() });
      if (!el.isConnected) return;
      const errors = (res && res.errors) || [];
      showErrors(errors);
      if (res && res.valid) {
        const keys = res.workload && typeof res.workload === 'object' ? Object.keys(res.workload).length : 0;
        setStatus(`Valid: ${res.path || res.name || 'playbook'}${res.workload ? ` · ${plural(keys, 'workload key')}` : ''}.`, 'ok');
      } else {
        const n = errors.length || 1;
        setStatus(`${plural(n, 'problem')}${errors.some((e) => e && e.line) ? ` (marked on ${n === 1 ? 'its line' : 'their lines'})` : ''}.`, 'error');
      }
    } catch (err) {
      if (err.status === 401) return;
      setStatus(`Could not validate: ${err.message}`, 'error');
    } finally {
      setBusy(false);
    }
  }

  async function save() {
    if (busy || tooLong()) return;
    if (!ta.value.trim()) { setStatus('The playbook is empty.', 'error'); return; }
    setBusy(true);
    setStatus('Saving…');
    try {
      const reg = await api('/api/catalog/register', { method: 'POST', body: body() });
      if (!el.isConnected) return;
      showErrors([]);
      setStatus(`Saved as ${reg.path} version ${reg.version}.`, 'ok');
      onSaved(reg);
    } catch (err) {
      if (err.status === 401) return;
      if (err.status === 400 || err.status === 422) {
        const errors = registerErrors(err);
        showErrors(errors);
        setStatus(`Not saved: ${plural(errors.length, 'problem')}.`, 'error');
      } else {
        setStatus(`Not saved: ${err.message}`, 'error');
      }
    } finally {
      setBusy(false);
    }
  }

  function dirty() {
    return ta.value !== original;
  }

  function cancel() {
    if (dirty() && !window.confirm('Discard your changes?')) return;
    onCancel();
  }

  ta.addEventListener('input', renderGutter);
  ta.addEventListener('scroll', syncScroll);
  ta.addEventListener('keydown', (ev) => {
    if (!(ev.ctrlKey || ev.metaKey) || ev.altKey) return;
    if (ev.key === 'Enter') { ev.preventDefault(); validate(); }
    else if (ev.key === 's' || ev.key === 'S') { ev.preventDefault(); save(); }
  });
  // The gutter follows the textarea's height when it is resized.
  const resize = typeof ResizeObserver === 'function' ? new ResizeObserver(syncScroll) : null;
  if (resize) resize.observe(ta);
  total = lineCount();
  gutter.style.minWidth = `calc(${String(total).length}ch + 18px)`;
  paint(true);

  return {
    el,
    dirty,
    focus() { ta.focus({ preventScroll: true }); ta.setSelectionRange(0, 0); paint(); },
    destroy() { if (resize) resize.disconnect(); },
  };
}

// -- the list -----------------------------------------------------------------------

export function mountCatalogList(root, ctx) {
  let items = [];
  let loaded = false;
  let dead = false;
  let sig = '';
  let editor = null;

  const filter = h('input', {
    type: 'search', class: 'filter', 'data-testid': 'catalog-filter', placeholder: 'Filter by path or file   /',
    'aria-label': 'Filter playbooks by path or source file', autocomplete: 'off', spellcheck: 'false',
  });
  filter.value = new URLSearchParams(location.search).get('q') || '';
  filter.addEventListener('input', () => {
    const q = new URLSearchParams(location.search);
    if (filter.value) q.set('q', filter.value); else q.delete('q');
    const qs = q.toString();
    history.replaceState(null, '', `${location.pathname}${qs ? `?${qs}` : ''}`);
    render();
  });
  const count = h('span', { class: 'muted count', 'data-testid': 'catalog-count' });
  const newBtn = canOperate(ctx.me)
    ? h('button', { type: 'button', class: 'primary', 'data-testid': 'catalog-new', onclick: () => openEditor() }, 'New playbook')
    : null;
  const editorSlot = h('div', { class: 'new-slot' });
  const tbody = h('tbody');
  const table = h('table', { class: 'grid catalog-table', 'data-testid': 'catalog-table' },
    h('thead', null, h('tr', null,
      h('th', null, 'Path'), h('th', { class: 'num' }, 'Latest'), h('th', { class: 'num' }, 'Versions'),
      h('th', null, 'Source file'), h('th', null, 'Registered'))),
    tbody);
  const empty = h('p', { class: 'empty', 'data-testid': 'catalog-empty' });

  root.append(h('section', { class: 'catalog-list-view' },
    h('div', { class: 'toolbar' }, h('h1', { class: 'page-title' }, 'Catalog'), filter, h('span', { class: 'spacer' }), count, newBtn),
    editorSlot,
    h('div', { class: 'table-wrap' }, table),
    empty,
    h('p', { class: 'hint muted' }, 'Register files with `flowtide catalog register FILE…`. Keys: / filters')));

  function openEditor() {
    if (editor) { editor.focus(); return; }
    editor = playbookEditor({
      text: TEMPLATE,
      sourceFile: '',
      heading: 'New playbook',
      onSaved(reg) {
        message(`Registered ${reg.path} version ${reg.version}.`, 'info');
        ctx.navigate(catalogPath(reg.path, reg.version));
      },
      onCancel: closeEditor,
    });
    editorSlot.replaceChildren(editor.el);
    if (newBtn) newBtn.hidden = true;
    editor.focus();
  }

  function closeEditor() {
    if (editor) editor.destroy();
    editor = null;
    editorSlot.replaceChildren();
    if (newBtn) { newBtn.hidden = false; newBtn.focus(); }
  }

  async function load() {
    try {
      const data = await api('/api/catalog/list');
      if (dead) return false;
      items = (data && data.items) || [];
      loaded = true;
      render();
    } catch (err) {
      if (dead || err.status === 401) return false;
      if (err.status === 403 || err.status === 404) {
        loaded = true;
        items = [];
        render();
        setText(empty, err.message);
        return false;
      }
      message(`Could not load the catalog: ${err.message}`);
    }
    return true;
  }

  function render() {
    const q = filter.value.trim().toLowerCase();
    const shown = q
      ? items.filter((it) => String(it.path ?? '').toLowerCase().includes(q)
        || String(it.source_file ?? '').toLowerCase().includes(q))
      : items;
    const now = Date.now() / 1000;
    const next = JSON.stringify([q, shown.map((it) => [it.path, it.version, it.versions, it.source_file, it.created]),
      Math.floor(now / 30)]);
    if (next !== sig) {
      sig = next;
      fill(tbody, shown.map((it) => h('tr', { 'data-testid': 'catalog-row', 'data-path': it.path },
        h('td', { class: 'path' }, h('a', { href: catalogPath(it.path), class: 'mono', 'data-testid': 'catalog-link' }, it.path)),
        h('td', { class: 'num' }, `v${it.version}`),
        h('td', { class: 'num' }, String(it.versions ?? '—')),
        h('td', { class: 'mono file', title: it.source_file || null }, it.source_file || h('span', { class: 'muted' }, '—')),
        h('td', { class: 'nowrap', title: absTime(it.created) }, relTime(it.created, now)))));
    }
    setText(count, loaded ? `${shown.length} shown${shown.length !== items.length ? ` of ${items.length}` : ''}` : '');
    empty.hidden = loaded && shown.length > 0;
    setText(empty, !loaded ? 'Loading…' : items.length ? 'No playbook matches the filter.' : 'No playbook is registered yet.');
  }

  function onKey(ev) {
    if (ev.defaultPrevented || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const t = ev.target instanceof Element ? ev.target : document.body;
    if (t === filter && ev.key === 'Escape') { filter.blur(); return; }
    if (t.matches('input, textarea, select, [contenteditable]')) return;
    if (ev.key === '/') {
      ev.preventDefault();
      filter.focus();
      filter.select();
    }
  }

  document.addEventListener('keydown', onKey);
  document.title = 'Catalog · flowtide';
  render();
  const poller = new Poller(load, 5000).start();

  return {
    update() {
      const q = new URLSearchParams(location.search).get('q') || '';
      if (document.activeElement !== filter) filter.value = q;
      render();
    },
    destroy() {
      dead = true;
      poller.stop();
      if (editor) editor.destroy();
      document.removeEventListener('keydown', onKey);
    },
  };
}

// -- one playbook -------------------------------------------------------------------

function readVersion() {
  const v = new URLSearchParams(location.search).get('version');
  return v && /^\d+$/.test(v) && Number(v) > 0 ? Number(v) : null;
}

/** The Run form of an entry: one input per workload key, its default prefilled. */
function runForm(entry, ctx, allowed) {
  const workload = entry.workload && typeof entry.workload === 'object' && !Array.isArray(entry.workload)
    ? entry.workload : null;
  const fields = Object.entries(workload || {}).map(([key, def], i) => {
    const id = `run-field-${i}`;
    const kind = typeof def === 'string' ? 'string'
      : def === null ? 'null' : Array.isArray(def) ? 'list' : typeof def;
    let text;
    let input;
    if (kind === 'string') {
      text = def;
      input = def.includes('\n')
        ? h('textarea', { id, rows: Math.min(8, def.split('\n').length), spellcheck: 'false' })
        : h('input', { type: 'text', id, spellcheck: 'false', autocomplete: 'off' });
    } else {
      const compact = JSON.stringify(def);
      text = (kind === 'list' || kind === 'object') && compact.length > 48 ? JSON.stringify(def, null, 2) : compact;
      input = kind === 'list' || kind === 'object'
        ? h('textarea', { id, class: 'mono', rows: Math.min(8, text.split('\n').length), spellcheck: 'false', wrap: 'soft' })
        : h('input', { type: 'text', id, class: 'mono', spellcheck: 'false', autocomplete: 'off' });
    }
    input.value = text;
    input.dataset.testid = `run-input-${key}`;
    input.dataset.key = key;
    const error = h('p', { class: 'field-error', id: `${id}-error`, 'data-testid': `run-field-error-${key}`, role: 'alert', hidden: true });
    const row = h('div', { class: 'field', 'data-key': key },
      h('label', { for: id }, h('span', { class: 'key' }, key), h('span', { class: 'type' }, kind === 'string' ? 'text' : `${kind} · JSON`)),
      input, error);
    const f = { key, def, kind, text, input, error, row };
    input.addEventListener('input', () => {
      row.classList.toggle('changed', input.value !== text);
      if (!error.hidden) { error.hidden = true; input.removeAttribute('aria-invalid'); input.removeAttribute('aria-describedby'); }
      chrome();
    });
    return f;
  });

  const formError = h('p', { class: 'form-error', 'data-testid': 'run-error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit', class: 'primary', 'data-testid': 'run-submit' }, 'Run');
  const reset = h('button', { type: 'button', 'data-testid': 'run-reset', onclick: resetAll }, 'Reset');
  const note = allowed ? null
    : h('p', { class: 'note', 'data-testid': 'run-note' }, 'Running a playbook needs the operator role.');
  const fieldset = h('fieldset', { disabled: !allowed },
    h('legend', { class: 'sr-only' }, 'Workload'),
    workload == null
      ? h('p', { class: 'muted small' }, 'This server does not say the workload defaults: the run uses them.')
      : fields.length ? fields.map((f) => f.row)
        : h('p', { class: 'muted small' }, 'This playbook has no workload: it runs without inputs.'),
    h('div', { class: 'toolbar' }, submit, reset, h('span', { class: 'muted small', 'data-testid': 'run-changed' })),
    formError);
  const form = h('form', { class: 'run-form', 'data-testid': 'run-form', novalidate: true, 'aria-label': 'Run this playbook' },
    note, fieldset);
  const changedNote = fieldset.querySelector('[data-testid="run-changed"]');

  function chrome() {
    const n = fields.filter((f) => f.input.value !== f.text).length;
    setText(changedNote, n ? `${plural(n, 'value')} changed` : 'defaults');
    reset.disabled = n === 0;
  }

  function resetAll() {
    for (const f of fields) {
      f.input.value = f.text;
      f.row.classList.remove('changed');
      f.error.hidden = true;
      f.input.removeAttribute('aria-invalid');
      f.input.removeAttribute('aria-describedby');
    }
    formError.hidden = true;
    chrome();
  }

  /** The changed keys, parsed; null after marking the inputs that do not parse. */
  function payload() {
    const out = {};
    let firstBad = null;
    for (const f of fields) {
      f.error.hidden = true;
      f.input.removeAttribute('aria-invalid');
      if (f.input.value === f.text) continue;
      if (f.kind === 'string') { out[f.key] = f.input.value; continue; }
      let value;
      try {
        value = JSON.parse(f.input.value);
      } catch (err) {
        f.error.textContent = `${f.key}: not valid JSON (${err.message}). Use JSON: 5, true, null, ["a"], {"k": 1} or "text" in quotes.`;
        f.error.hidden = false;
        f.input.setAttribute('aria-invalid', 'true');
        f.input.setAttribute('aria-describedby', f.error.id);
        firstBad = firstBad || f;
        continue;
      }
      if (JSON.stringify(value) !== JSON.stringify(f.def)) out[f.key] = value;
    }
    if (firstBad) { firstBad.input.focus(); return null; }
    return out;
  }

  function start(body) {
    return api('/api/execute', { method: 'POST', body });
  }

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    if (!allowed || submit.disabled) return;
    formError.hidden = true;
    const changed = payload();
    if (changed == null) return;
    submit.disabled = true;
    setText(submit, 'Starting…');
    try {
      const res = await start({ catalog_id: entry.catalog_id, payload: changed });
      if (!form.isConnected) return;
      const id = res && res.execution_id != null ? String(res.execution_id) : null;
      if (!id) throw new Error('the server did not say which execution it started');
      message(`Started execution ${id} of ${entry.catalog_id}.`, 'info');
      ctx.navigate(execPath(id));
    } catch (err) {
      if (err.status === 401 || !form.isConnected) return;
      formError.textContent = `Not started: ${err.message}`;
      formError.hidden = false;
    } finally {
      submit.disabled = false;
      setText(submit, 'Run');
    }
  });
  chrome();
  return form;
}

export function mountCatalogEntry(root, ctx, path) {
  let dead = false;
  let entry = null;
  let version = readVersion();
  let seq = 0;
  let editor = null;
  let formFor = null; // catalog_id the run form was built for
  const allowed = canOperate(ctx.me);

  const title = h('h1', { class: 'mono cat-path', 'data-testid': 'catalog-path' }, path);
  const editBtn = allowed
    ? h('button', { type: 'button', 'data-testid': 'catalog-edit', onclick: () => openEditor(), hidden: true }, 'Edit')
    : null;
  const nameEl = h('p', { class: 'cat-name', 'data-testid': 'catalog-name' });
  const descEl = h('p', { class: 'desc', 'data-testid': 'catalog-description' });
  const select = h('select', { id: 'cat-version', 'data-testid': 'version-select', 'aria-label': 'Version' });
  select.addEventListener('change', () => {
    if (editor && editor.dirty() && !window.confirm('Discard your changes?')) {
      select.value = String(entry ? entry.version : '');
      return;
    }
    closeEditor(false);
    history.pushState(null, '', catalogPath(path, select.value));
    update();
  });
  const meta = h('dl', { class: 'meta' });
  const stored = h('div', { class: 'warn', 'data-testid': 'stored-errors', role: 'status', hidden: true });
  const codeSlot = h('div', { class: 'code-slot' }, h('p', { class: 'muted' }, 'Loading…'));
  const runSlot = h('div', { class: 'run-slot' });
  const recentBody = h('tbody');
  const recentEmpty = h('p', { class: 'empty small', 'data-testid': 'recent-empty' }, 'Loading…');
  const recentTable = h('table', { class: 'grid compact', 'data-testid': 'recent-table' },
    h('thead', null, h('tr', null, h('th', null, 'Execution'), h('th', { class: 'num' }, 'Ver.'),
      h('th', null, 'Status'), h('th', null, 'Created'))),
    recentBody);
  const recentWrap = h('div', { class: 'table-wrap', hidden: true }, recentTable);
  const missing = h('div', { class: 'empty-page', 'data-testid': 'catalog-missing', hidden: true });
  const body = h('div', { class: 'cat-layout' },
    h('div', { class: 'cat-main' }, h('h3', null, 'Playbook'), codeSlot),
    h('aside', { class: 'cat-side' },
      h('section', { class: 'panel', 'aria-labelledby': 'run-title' }, h('h2', { id: 'run-title' }, 'Run'), runSlot),
      h('section', { class: 'panel', 'aria-labelledby': 'recent-title' },
        h('h2', { id: 'recent-title' }, 'Recent executions'),
        recentWrap, recentEmpty)));
  const about = h('div', { class: 'cat-about' }, nameEl, descEl);
  const head = h('div', { class: 'detail-head' },
    h('div', { class: 'title-row' }, title,
      h('span', { class: 'version-pick' }, h('label', { for: 'cat-version', class: 'muted' }, 'Version'), select),
      h('span', { class: 'spacer' }), editBtn),
    about,
    meta, stored);

  root.append(h('section', { class: 'catalog-view' },
    h('a', { href: '/ui/catalog', class: 'back' }, '← Catalog'),
    missing, head, body));
  document.title = `${path} · Catalog · flowtide`;

  async function load() {
    const mine = ++seq;
    const q = version != null ? `?version=${enc(version)}` : '';
    try {
      const doc = await api(`/api/catalog/${encPath(path)}${q}`);
      if (dead || mine !== seq) return;
      entry = doc;
      render();
    } catch (err) {
      if (dead || mine !== seq || err.status === 401) return;
      if (err.status === 404) {
        head.hidden = true;
        body.hidden = true;
        fill(missing, h('h1', null, version != null ? `No version ${version} of ${path}` : `No playbook at ${path}`),
          h('p', { class: 'muted' }, err.message),
          h('p', null, h('a', { href: '/ui/catalog' }, 'Back to the catalog')));
        missing.hidden = false;
        return;
      }
      codeSlot.replaceChildren(h('p', { class: 'form-error', role: 'alert' }, `Could not load ${path}: ${err.message}`));
    }
  }

  function render() {
    const e = entry;
    head.hidden = false;
    body.hidden = false;
    missing.hidden = true;
    setText(title, e.path);
    document.title = `${e.path} v${e.version} · Catalog · flowtide`;
    setText(nameEl, e.name ? e.name : '');
    nameEl.hidden = !e.name;
    setText(descEl, e.description || '');
    descEl.hidden = !e.description;
    about.hidden = !e.name && !e.description;
    const n = Number(e.versions) || e.version;
    fill(select, Array.from({ length: n }, (_, i) => n - i).map((v) =>
      h('option', { value: v }, `v${v}${v === n ? ' (latest)' : ''}`)));
    select.value = String(e.version);
    fill(meta,
      h('dt', null, 'Catalog id'), h('dd', { class: 'mono', 'data-testid': 'catalog-id' }, e.catalog_id),
      h('dt', null, 'Source file'), h('dd', { class: 'mono' }, e.source_file || '—'),
      Number.isInteger(e.steps) && e.steps > 0 ? [h('dt', null, 'Steps'), h('dd', null, String(e.steps))] : null,
      h('dt', null, 'Registered'), h('dd', { title: absTime(e.created) }, `${absTime(e.created)} (${relTime(e.created)})`));
    const errors = Array.isArray(e.errors) ? e.errors : [];
    stored.hidden = errors.length === 0;
    setText(stored, errors.length
      ? `This version no longer validates: ${plural(errors.length, 'problem')}, shown under ${errors.length === 1 ? 'its line' : 'their lines'}.`
      : '');
    if (!editor) showCode();
    if (editBtn) editBtn.hidden = Boolean(editor);
    if (formFor !== e.catalog_id) {
      formFor = e.catalog_id;
      runSlot.replaceChildren(runForm(e, ctx, allowed));
    }
  }

  function showCode() {
    codeSlot.replaceChildren(codeView(entry.content, Array.isArray(entry.errors) ? entry.errors : []));
  }

  function openEditor() {
    if (!entry || editor) return;
    editor = playbookEditor({
      text: entry.content,
      sourceFile: entry.source_file,
      heading: `Editing ${entry.path} (from v${entry.version})`,
      onSaved(reg) {
        const same = reg.path === entry.path && reg.version === entry.version;
        message(same ? `No change: ${reg.path} stays at version ${reg.version}.`
          : `Registered ${reg.path} version ${reg.version}.`, 'info');
        closeEditor(false);
        if (reg.path === path) {
          history.pushState(null, '', catalogPath(reg.path, reg.version));
          update();
        } else {
          ctx.navigate(catalogPath(reg.path, reg.version));
        }
      },
      onCancel: () => closeEditor(true),
    });
    codeSlot.replaceChildren(editor.el);
    editBtn.hidden = true;
    editor.focus();
  }

  function closeEditor(focus) {
    if (!editor) return;
    editor.destroy();
    editor = null;
    if (entry) showCode();
    if (editBtn) {
      editBtn.hidden = false;
      if (focus) editBtn.focus();
    }
  }

  async function loadRecent() {
    try {
      const data = await api(`/api/executions?${new URLSearchParams({ playbook: path, limit: '10' })}`);
      if (dead) return false;
      // The filter is a substring: keep this path's runs only.
      const items = ((data && data.items) || []).filter((it) => it.playbook === path);
      const now = Date.now() / 1000;
      fill(recentBody, items.map((it) => h('tr', { 'data-testid': 'recent-row', 'data-id': it.execution_id, 'data-status': it.status ?? '' },
        h('td', null, execLink(String(it.execution_id))),
        h('td', { class: 'num' }, it.version != null ? `v${it.version}` : '—'),
        h('td', null, badge(it.status)),
        h('td', { class: 'nowrap', title: absTime(it.created) }, relTime(it.created, now)))));
      recentWrap.hidden = items.length === 0;
      recentEmpty.hidden = items.length > 0;
      setText(recentEmpty, 'No execution of this playbook yet.');
    } catch (err) {
      if (dead || err.status === 401) return false;
      recentWrap.hidden = true;
      recentEmpty.hidden = false;
      setText(recentEmpty, `Could not load its executions: ${err.message}`);
      return err.status !== 403;
    }
    return true;
  }

  function update() {
    const next = readVersion();
    if (next === version && entry) return;
    if (editor && editor.dirty() && !window.confirm('Discard your changes?')) {
      history.pushState(null, '', catalogPath(path, entry ? entry.version : version));
      return;
    }
    closeEditor(false);
    version = next;
    load();
  }

  load();
  const poller = new Poller(loadRecent, 3000).start();

  return {
    update,
    destroy() {
      dead = true;
      poller.stop();
      if (editor) editor.destroy();
    },
  };
}
