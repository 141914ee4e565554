# PipeBD service image: the same image runs the API (`pipebd api`) and the workers (`pipebd worker`).
# torch==2.14.1 from PyPI is a CUDA build that also runs on CPU; GPU workers need the NVIDIA
# container toolkit on the host (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIPEBD_DATA_DIR=/data

WORKDIR /opt/pipebd

# Dependencies first, so code changes do not reinstall torch.
COPY pyproject.toml README.md ./
RUN mkdir -p pipebd_core app worker \
    && touch pipebd_core/__init__.py app/__init__.py worker/__init__.py \
    && pip install -e . \
    && rm -rf pipebd_core app worker

COPY alembic.ini ./
COPY migrations ./migrations
COPY pipebd_core ./pipebd_core
COPY app ./app
COPY templates ./templates
COPY worker ./worker
COPY examples ./examples
RUN pip install --no-deps -e . && mkdir -p /data

EXPOSE 8000
CMD ["pipebd", "api", "--host", "0.0.0.0", "--port", "8000"]
