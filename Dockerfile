# One image for the web server and the device workers. On a GPU server PyPI's torch==2.13.0 wheel is the
# CUDA build; the NVIDIA container toolkit provides the driver at run time.
FROM python:3.11-slim

# HF_HUB_OFFLINE: Hydra never reaches a model hub (its models come from the catalog's local directories).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY webapp ./webapp
COPY worker ./worker
COPY templates ./templates
COPY static ./static
COPY manage.py ./
RUN pip install --upgrade pip && pip install .
RUN useradd --create-home --uid 1000 hydra && mkdir -p /data /spill && chown hydra /data /spill
USER hydra
EXPOSE 8000
CMD ["gunicorn", "webapp.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--timeout", "120"]
