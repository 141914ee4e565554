// The jobs list stays live: every few seconds the rows of the same filter and page are fetched as
// HTML (/partials/jobs) and each row that changed is replaced in place; cancel buttons ask the API.
import { fetchPart, handleCancelButtons } from "./server.js";

const table = document.getElementById("jobs");
const body = document.getElementById("job-rows");
const status = document.getElementById("list-status");
const refreshMs = Number(table.dataset.refreshS || 2) * 1000;

function rowsOf(html) {
  const template = document.createElement("template");
  template.innerHTML = `<table><tbody>${html}</tbody></table>`;
  return [...template.content.querySelectorAll("tbody > tr")];
}

// Replace changed rows, add new ones, drop vanished ones, in the server's order.
function patch(fresh) {
  const focused = document.activeElement?.id;
  const current = new Map([...body.children].map((row) => [row.id, row]));
  let changed = 0;
  fresh.forEach((row, index) => {
    const old = current.get(row.id);
    let node = old;
    if (!old || old.dataset.version !== row.dataset.version) {
      node = row;
      if (old) old.replaceWith(row);
      changed += 1;
    }
    if (body.children[index] !== node) body.insertBefore(node, body.children[index] ?? null);
  });
  const keep = new Set(fresh.map((row) => row.id));
  [...body.children].filter((row) => !keep.has(row.id)).forEach((row) => row.remove());
  if (focused && document.activeElement?.id !== focused) document.getElementById(focused)?.focus();
  return changed;
}

let timer = null;
async function refresh() {
  clearTimeout(timer);
  try {
    const html = await fetchPart(table.dataset.rowsUrl);
    if (html !== null) patch(rowsOf(html));
  } catch (error) {
    status.textContent = `Could not refresh the list (${error.message}); retrying.`;
  }
  timer = setTimeout(refresh, document.hidden ? refreshMs * 5 : refreshMs);
}

handleCancelButtons(body, status, refresh);
timer = setTimeout(refresh, refreshMs);
document.body.dataset.ready = "1";
