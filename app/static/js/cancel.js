// Cancel buttons (`data-cancel="<job id>"`) anywhere under a root element: confirm, ask the API,
// report the outcome in a status element, then let the page refresh what it shows.
import { cancelJob } from "./api.js";

export function handleCancelButtons(root, statusElement, onDone) {
  root.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-cancel]");
    if (!button) return;
    const jobId = button.dataset.cancel;
    if (!window.confirm(`Cancel job #${jobId} (${button.dataset.name ?? ""})? Its ranks are stopped.`)) return;
    button.disabled = true;
    try {
      const job = await cancelJob(jobId);
      if (statusElement) statusElement.textContent = `Job #${jobId} is ${job.state}.`;
    } catch (error) {
      button.disabled = false;
      if (statusElement) statusElement.textContent = `Could not cancel job #${jobId}: ${error.message}`;
    }
    onDone?.(jobId);
  });
}
