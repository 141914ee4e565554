// Following a job's event stream (Server-Sent Events): `state`, `metrics` and `log` events with ids,
// then `end`. EventSource reconnects by itself and resumes with Last-Event-ID; after `end` we close
// it, or it would reconnect to a finished stream forever.

export function followJob(jobId, afterEventId, handlers) {
  const source = new EventSource(`/api/v1/jobs/${jobId}/events?after=${afterEventId}`);
  for (const name of ["state", "metrics", "log"]) {
    source.addEventListener(name, (event) => handlers[name]?.(JSON.parse(event.data)));
  }
  source.addEventListener("end", (event) => {
    source.close();
    handlers.end?.(JSON.parse(event.data));
  });
  source.addEventListener("error", () => handlers.connection?.(source.readyState));
  source.addEventListener("open", () => handlers.connection?.(source.readyState));
  return source;
}
