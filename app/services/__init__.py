"""Job services: what the HTTP routes call to admit, store, check, resume and serve jobs."""
