"""The PipeBD worker: a Celery worker that launches jobs with torchrun on its node and reports on them."""
