// The new-job page: load a bundled example into the editor, show the equivalent curl command, post
// the spec to the API as YAML, and put each problem the API reports next to its field's line.
import { SpecEditor } from "./editor.js";
import { ApiError, request } from "./server.js";
import { lineOf } from "./yaml_paths.js";

const examples = JSON.parse(document.getElementById("examples-data").textContent);
const config = JSON.parse(document.getElementById("new-job-config").textContent);
const form = document.getElementById("new-job");
const status = document.getElementById("submit-status");
const curl = document.getElementById("curl-command");
const editor = new SpecEditor({
  textarea: document.getElementById("spec"),
  backdrop: document.getElementById("spec-backdrop"),
  gutter: document.getElementById("spec-gutter"),
  list: document.getElementById("spec-errors"),
});

function newKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}
let idempotencyKey = newKey(); // one per version of the text: a double click submits once

export function curlCommand(apiUrl, text, auth) {
  let delimiter = "SPEC";
  while (text.split("\n").includes(delimiter)) delimiter += "_END";
  const lines = [`curl -sS -X POST '${apiUrl}' \\`, "  -H 'Content-Type: application/yaml' \\"];
  if (auth) lines.push('  -H "Authorization: Bearer $PIPEBD_TOKEN" \\');
  lines.push(`  --data-binary @- <<'${delimiter}'`, text.replace(/\n+$/, ""), delimiter);
  return lines.join("\n");
}

function showCurl() {
  curl.textContent = curlCommand(config.apiUrl, editor.text, config.auth);
}

// The API's problem as problems on lines: each bad field's `loc` finds its line; a body that is not
// YAML at all says its line number in the detail.
export function problemsOf(error, text) {
  const errors = error.problem?.errors ?? [];
  if (errors.length) {
    return errors.map((item) => {
      const path = (item.loc ?? []).slice(item.loc?.[0] === "body" ? 1 : 0);
      return { line: path.length ? lineOf(text, path) : -1, field: path.join("."), message: item.message };
    });
  }
  const message = error.problem?.detail || error.message;
  const found = /line (\d+)/.exec(message);
  return [{ line: found ? Number(found[1]) - 1 : -1, field: "", message }];
}

async function submit(event) {
  event.preventDefault();
  const button = document.getElementById("submit-job");
  button.disabled = true;
  status.textContent = "Submitting…";
  try {
    const job = await request("/api/v1/jobs", {
      method: "POST",
      headers: { "Content-Type": "application/yaml", "Idempotency-Key": idempotencyKey },
      body: editor.text,
    });
    status.textContent = `Job #${job.id} is ${job.state}; opening its page.`;
    window.location.assign(`/jobs/${job.id}`);
  } catch (error) {
    const problems = error instanceof ApiError ? problemsOf(error, editor.text) : [{ line: -1, field: "", message: error.message }];
    editor.setProblems(problems);
    status.textContent = `Not submitted: ${problems.length} problem${problems.length === 1 ? "" : "s"} to fix.`;
    button.disabled = false;
  }
}

document.getElementById("load-example").addEventListener("click", () => {
  const name = document.getElementById("example").value;
  editor.text = examples[name] ?? "";
  idempotencyKey = newKey();
  showCurl();
  status.textContent = `Loaded ${name}.`;
});
editor.textarea.addEventListener("input", () => {
  idempotencyKey = newKey();
  showCurl();
});
document.getElementById("copy-curl").addEventListener("click", async () => {
  const note = document.getElementById("copy-status");
  try {
    await navigator.clipboard.writeText(curl.textContent);
    note.textContent = "Copied.";
  } catch {
    note.textContent = "Copying is not allowed here; select the text instead.";
  }
});
form.addEventListener("submit", submit);
showCurl();
document.body.dataset.ready = "1";
