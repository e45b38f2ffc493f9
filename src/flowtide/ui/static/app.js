// flowtide web UI: boot, header, login and the History API router.
import { api, setUnauthorizedHandler } from './api.js';
import { h, message } from './util.js';
import { mountList } from './list.js';
import { mountDetail } from './detail.js';
import { mountWorkers } from './workers.js';
import { mountCatalogList, mountCatalogEntry } from './catalog.js';
import { mountSchedules, mountSchedule } from './schedules.js';
import { mountHooks } from './hooks.js';
import { mountSubscriptions } from './subscriptions.js';

const view = document.getElementById('view');
const userBox = document.getElementById('user');
const userName = document.getElementById('user-name');
const userRole = document.getElementById('user-role');
const logoutBtn = document.getElementById('logout');
const navExecutions = document.getElementById('nav-executions');
const navWorkers = document.getElementById('nav-workers');
const navCatalog = document.getElementById('nav-catalog');
const navSchedules = document.getElementById('nav-schedules');
const navHooks = document.getElementById('nav-hooks');
const navSubscriptions = document.getElementById('nav-subscriptions');

let me = null; // whoami, or null when logged out
let current = null; // {key, view: {destroy(), update?()}}
let loginShown = false;

const ctx = { navigate, get me() { return me; } };

function navigate(url) {
  history.pushState(null, '', url);
  route();
}

function renderUser() {
  userBox.hidden = !me;
  userName.textContent = me ? me.name || me.subject || '?' : '';
  userRole.textContent = me ? me.role || '' : '';
  navExecutions.hidden = !me;
  navWorkers.hidden = !me;
  navCatalog.hidden = !me;
  navSchedules.hidden = !me;
  navHooks.hidden = !me;
  navSubscriptions.hidden = !me;
}

function stopView() {
  if (current && current.view && current.view.destroy) current.view.destroy();
  current = null;
}

function notFound() {
  view.replaceChildren(h('section', { class: 'empty-page' },
    h('h1', null, 'Page not found'),
    h('p', null, h('a', { href: '/ui/executions' }, 'Go to executions'))));
  document.title = 'Not found · flowtide';
  return { destroy() {} };
}

function route(force = false) {
  if (!me) return;
  const path = location.pathname.replace(/\/+$/, '');
  const m = path.match(/^\/ui\/executions\/([^/]+)$/);
  let id = null;
  try { id = m ? decodeURIComponent(m[1]) : null; } catch { /* a malformed id: not found */ }
  // A catalog path has slashes: /ui/catalog/<segment>/<segment>…, each one encoded.
  const c = path.match(/^\/ui\/catalog\/(.+)$/);
  let catalogPath = null;
  try { catalogPath = c ? c[1].split('/').map(decodeURIComponent).join('/') : null; } catch { /* not found */ }
  const sch = path.match(/^\/ui\/schedules\/([^/]+)$/);
  let scheduleName = null;
  try { scheduleName = sch ? decodeURIComponent(sch[1]) : null; } catch { /* not found */ }
  let key = 'missing';
  let mount = notFound;
  if (path === '/ui' || path === '/ui/executions') [key, mount] = ['list', () => mountList(view, ctx)];
  else if (id) [key, mount] = [`detail:${id}`, () => mountDetail(view, ctx, id)];
  else if (path === '/ui/workers') [key, mount] = ['workers', () => mountWorkers(view)];
  else if (path === '/ui/catalog') [key, mount] = ['catalog', () => mountCatalogList(view, ctx)];
  else if (catalogPath) [key, mount] = [`catalog:${catalogPath}`, () => mountCatalogEntry(view, ctx, catalogPath)];
  else if (path === '/ui/schedules') [key, mount] = ['schedules', () => mountSchedules(view, ctx)];
  else if (path === '/ui/hooks') [key, mount] = ['hooks', () => mountHooks(view)];
  else if (path === '/ui/subscriptions') [key, mount] = ['subscriptions', () => mountSubscriptions(view, ctx)];
  else if (scheduleName) [key, mount] = [`schedule:${scheduleName}`, () => mountSchedule(view, ctx, scheduleName)];
  navExecutions.classList.toggle('active', key === 'list');
  navWorkers.classList.toggle('active', key === 'workers');
  navCatalog.classList.toggle('active', key === 'catalog' || key.startsWith('catalog:'));
  navSchedules.classList.toggle('active', key === 'schedules' || key.startsWith('schedule:'));
  navHooks.classList.toggle('active', key === 'hooks');
  navSubscriptions.classList.toggle('active', key === 'subscriptions');
  if (!force && current && current.key === key && current.view.update) {
    current.view.update();
    return;
  }
  stopView();
  view.replaceChildren();
  current = { key, view: mount() };
}

function showLogin() {
  if (loginShown) return;
  stopView();
  loginShown = true;
  me = null;
  renderUser();
  document.title = 'Log in · flowtide';
  const input = h('input', {
    type: 'password', id: 'login-token', name: 'token', 'data-testid': 'login-token',
    autocomplete: 'current-password', spellcheck: 'false', required: true,
  });
  const error = h('p', { class: 'login-error', 'data-testid': 'login-error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit', class: 'primary', 'data-testid': 'login-submit' }, 'Log in');
  const form = h('form', { class: 'login-card', novalidate: true },
    h('h1', null, 'Log in to flowtide'),
    h('label', { for: 'login-token' }, 'Access token'),
    input, error, submit);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const token = input.value.trim();
    if (!token) {
      error.textContent = 'Enter your access token.';
      error.hidden = false;
      return;
    }
    submit.disabled = true;
    error.hidden = true;
    try {
      const who = await api('/api/session', { method: 'POST', body: { token }, auth: false });
      input.value = '';
      try {
        me = await api('/api/whoami', { auth: false });
      } catch {
        me = who || { name: '?', role: '' };
      }
      loginShown = false;
      renderUser();
      route(true);
    } catch (err) {
      error.textContent = err.status === 401 ? `Invalid token: ${err.message}` : err.message;
      error.hidden = false;
      input.select();
    } finally {
      submit.disabled = false;
    }
  });
  view.replaceChildren(h('section', { class: 'login-view' }, form));
  input.focus();
}

async function logout() {
  try {
    await api('/api/session', { method: 'DELETE', auth: false });
  } catch (err) {
    message(`Log out failed: ${err.message}`);
    return;
  }
  showLogin();
}

function onLinkClick(ev) {
  if (ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
  const a = ev.target instanceof Element ? ev.target.closest('a[href]') : null;
  if (!a || a.target || a.hasAttribute('download')) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !/^\/ui(\/|$)/.test(url.pathname)) return;
  ev.preventDefault();
  navigate(url.pathname + url.search);
}

// `flowtide ui` prints a URL whose fragment holds its token (a fragment never reaches a
// server or its logs): sign in with it once, then drop it from the address bar.
async function signInFromFragment() {
  const m = location.hash.match(/^#token=([A-Za-z0-9_-]{16,200})$/);
  if (!m) return;
  history.replaceState(null, '', location.pathname + location.search);
  try {
    await api('/api/session', { method: 'POST', body: { token: m[1] }, auth: false });
  } catch (err) {
    message(`Sign-in with the link's token failed: ${err.message}`);
  }
}

async function start() {
  await signInFromFragment();
  try {
    me = await api('/api/whoami');
  } catch (err) {
    if (err.status === 401) return; // the login view is up
    view.replaceChildren(h('section', { class: 'empty-page' },
      h('h1', null, 'flowtide is not reachable'),
      h('p', { class: 'muted' }, err.message)));
    const retry = h('button', { type: 'button' }, 'Retry');
    retry.addEventListener('click', start, { once: true });
    view.firstChild.append(retry);
    return;
  }
  renderUser();
  route(true);
}

setUnauthorizedHandler(showLogin);
logoutBtn.addEventListener('click', logout);
document.addEventListener('click', onLinkClick);
window.addEventListener('popstate', () => route());
start();
