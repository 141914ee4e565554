"""What the worker may import from the service: settings, database, tables, lifecycle, queue, reaper,
rollups and downsampling. Nothing here knows about HTTP or pages (those live in app/api and app/web)."""
