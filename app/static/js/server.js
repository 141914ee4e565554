// Talking to the service from the pages: JSON requests to the API (with the problem a failed one
// answers, and the login page on 401), server-rendered parts fetched again and swapped in, the job's
// event stream, and cancel buttons.

// A failed request: its status and the API's problem body ({detail, errors: [{loc, message, value}]}).
export class ApiError extends Error {
  constructor(status, problem) {
    super(problemText(problem) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

// The field a problem item is about, as a reader names it: `train.epochs` for ["body", "train", "epochs"].
export function fieldOf(item) {
  const loc = (item.loc ?? []).map(String);
  return loc.slice(1).join(".") || (loc[0] ?? "");
}

// A problem body as one readable line: each bad field with its message, or the detail.
export function problemText(problem) {
  const errors = problem?.errors ?? [];
  if (errors.length) return errors.map((item) => `${fieldOf(item)}: ${item.message}`).join("; ");
  return problem?.detail ?? "";
}

export function goLogin() {
  const here = window.location.pathname + window.location.search;
  window.location.assign(`/login?next=${encodeURIComponent(here)}`);
}

async function readProblem(response) {
  try {
    return await response.json();
  } catch {
    return { detail: response.statusText, errors: [] };
  }
}

export async function request(url, options = {}) {
  const response = await fetch(url, { ...options, headers: { Accept: "application/json", ...(options.headers ?? {}) } });
  if (response.status === 401) {
    goLogin();
    throw new ApiError(401, { detail: "log in first", errors: [] });
  }
  if (!response.ok) throw new ApiError(response.status, await readProblem(response));
  return response.status === 204 ? null : response.json();
}

export const getJSON = (url) => request(url);

// Server-rendered parts of a page (templates/partials): fetch the HTML again and swap it in,
// keeping the keyboard focus on the element with the same id, and what the reader changed in it:
// which <details> with an id are open, and how far each element with an id is scrolled sideways.
export async function fetchPart(url) {
  const response = await fetch(url, { headers: { Accept: "text/html" } });
  if (response.redirected && new URL(response.url).pathname === "/login") {
    goLogin();
    return null;
  }
  return response.ok ? response.text() : null;
}

export async function refreshPart(element, url) {
  const html = await fetchPart(url);
  if (html === null) return false;
  const focused = document.activeElement && element.contains(document.activeElement) ? document.activeElement.id : null;
  const opened = new Map([...element.querySelectorAll("details[id]")].map((details) => [details.id, details.open]));
  const scrolled = [...element.querySelectorAll("[id]")].filter((node) => node.scrollLeft > 0).map((node) => [node.id, node.scrollLeft]);
  element.innerHTML = html;
  for (const [id, open] of opened) {
    const details = document.getElementById(id);
    if (details && element.contains(details)) details.open = open;
  }
  for (const [id, left] of scrolled) {
    const node = document.getElementById(id);
    if (node && element.contains(node)) node.scrollLeft = left;
  }
  if (focused) document.getElementById(focused)?.focus();
  return true;
}

// Call `fn` at most once per `ms`; a call inside the interval is run at its end (never dropped).
export function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  return () => {
    const wait = last + ms - Date.now();
    if (wait <= 0 && timer === null) {
      last = Date.now();
      fn();
    } else if (timer === null) {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, Math.max(0, wait));
    }
  };
}

// A job's event stream (Server-Sent Events): `state`, `metrics` and `log` events with ids, then
// `end`. EventSource reconnects by itself and resumes with Last-Event-ID; after `end` we close it,
// or it would reconnect to a finished stream forever.
export function followJob(jobId, afterEventId, handlers) {
  const source = new EventSource(`/api/v1/jobs/${jobId}/events?after=${afterEventId}`);
  for (const name of ["state", "phase", "metrics", "log"]) {
    source.addEventListener(name, (event) => handlers[name]?.(JSON.parse(event.data)));
  }
  source.addEventListener("end", (event) => {
    source.close();
    handlers.end?.(JSON.parse(event.data));
  });
  return source;
}

// Pause and resume buttons (`data-action="pause|resume" data-job="<job id>"`, or `data-sweep="<sweep id>"`
// for every job of a sweep, with `cancel` too) under `root`: confirm when the button has `data-confirm`, ask
// the API (a refusal's problem detail says why), say how it went in `statusElement`, then let the page refresh.
export function handleActionButtons(root, statusElement, onDone) {
  root.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const { action, job: jobId, sweep: sweepId, confirm } = button.dataset;
    if (confirm && !window.confirm(confirm)) return;
    const [what, url] = sweepId ? [`Sweep #${sweepId}`, `/api/v1/sweeps/${sweepId}`] : [`Job #${jobId}`, `/api/v1/jobs/${jobId}`];
    button.disabled = true;
    const status = statusElement ?? root.querySelector("#action-status");
    try {
      const answer = await request(`${url}/${action}`, { method: "POST" });
      if (status) status.textContent = `${what} is ${answer.state}.`;
    } catch (error) {
      button.disabled = false;
      if (status) status.textContent = `Could not ${action} ${what.toLowerCase()}: ${error.message}`;
      return;
    }
    onDone?.(sweepId ?? jobId, action);
  });
}

// Cancel buttons (`data-cancel="<job id>"`) under `root`: confirm, ask the API, say how it went in
// `statusElement`, then let the page refresh what it shows.
export function handleCancelButtons(root, statusElement, onDone) {
  root.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-cancel]");
    if (!button) return;
    const jobId = button.dataset.cancel;
    if (!window.confirm(`Cancel job #${jobId} (${button.dataset.name ?? ""})? Its ranks are stopped.`)) return;
    button.disabled = true;
    try {
      const job = await request(`/api/v1/jobs/${jobId}/cancel`, { method: "POST" });
      if (statusElement) statusElement.textContent = `Job #${jobId} is ${job.state}.`;
    } catch (error) {
      button.disabled = false;
      if (statusElement) statusElement.textContent = `Could not cancel job #${jobId}: ${error.message}`;
    }
    onDone?.(jobId);
  });
}
