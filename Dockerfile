# Interlock: the sidecar proxy, as an image. Build: docker build -t interlock .
# Dependencies come from the hash-pinned requirements.lock (the same set CI tests with).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY requirements.lock pyproject.toml README.md ./
RUN pip install "uv==0.13.8" \
    && uv pip sync --system --require-hashes requirements.lock

COPY policies/ policies/
COPY ledger/ ledger/
COPY proxy/ proxy/
COPY examples/ examples/
RUN pip install --no-deps . \
    && useradd --system --uid 10001 --home-dir /var/lib/interlock --create-home interlock

USER interlock
WORKDIR /var/lib/interlock
EXPOSE 8787
# /healthz answers while the process runs; /readyz also needs the ledger.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/readyz', timeout=2)"
ENTRYPOINT ["interlock"]
CMD ["serve", "--config", "/etc/interlock/interlock.yaml"]
