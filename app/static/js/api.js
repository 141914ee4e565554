// Talking to the API from the pages: JSON requests, the error text of a failed one, login on 401.

export class ApiError extends Error {
  constructor(status, detail) {
    super(detailText(detail) || `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

// A FastAPI `detail` (a string, or a list of {loc, msg}) as one readable line.
export function detailText(detail) {
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map((item) => item.msg ?? JSON.stringify(item)).join("; ");
  return detail ? JSON.stringify(detail) : "";
}

export function goLogin() {
  const here = window.location.pathname + window.location.search;
  window.location.assign(`/login?next=${encodeURIComponent(here)}`);
}

async function readDetail(response) {
  try {
    return (await response.json()).detail;
  } catch {
    return response.statusText;
  }
}

export async function request(url, options = {}) {
  const response = await fetch(url, { ...options, headers: { Accept: "application/json", ...(options.headers ?? {}) } });
  if (response.status === 401) {
    goLogin();
    throw new ApiError(401, "log in first");
  }
  if (!response.ok) throw new ApiError(response.status, await readDetail(response));
  return response.status === 204 ? null : response.json();
}

export const getJSON = (url) => request(url);

export function cancelJob(jobId) {
  return request(`/api/v1/jobs/${jobId}/cancel`, { method: "POST" });
}
