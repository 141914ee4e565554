// A sweep page stays live: every few seconds, while the sweep has not ended, its part (status, best job,
// children) is fetched again as HTML; the bulk Pause, Resume and Cancel buttons ask the API.
import { handleActionButtons, refreshPart } from "./server.js";

const part = document.getElementById("part-sweep");
const status = document.getElementById("sweep-status");
const refreshMs = Number(part.dataset.refreshS || 2) * 1000;
const ENDED = new Set(["succeeded", "failed", "cancelled"]);

let timer = null;
async function refresh() {
  clearTimeout(timer);
  try {
    await refreshPart(part, `/sweeps/${part.dataset.sweep}/partials/sweep`);
  } catch (error) {
    status.textContent = `Could not refresh the sweep (${error.message}); retrying.`;
  }
  const state = part.querySelector("#sweep-summary")?.dataset.state;
  if (!ENDED.has(state)) timer = setTimeout(refresh, document.hidden ? refreshMs * 5 : refreshMs);
}

handleActionButtons(part, status, refresh);
timer = setTimeout(refresh, refreshMs);
document.body.dataset.ready = "1";
