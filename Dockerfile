# The console and the consumer daemons: one image, the command picks the role.
#   web:      daphne -b 0.0.0.0 -p 8000 mrtadmin.asgi:application   (the default)
#   daemons:  python manage.py runconsumer all
# ZK_HOSTS must point at the ensemble; the image carries no ZooKeeper of its own.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MRT_VAR_DIR=/var/lib/mrt \
    DJANGO_STATIC_ROOT=/app/staticfiles

RUN useradd --system --create-home --home-dir /home/mrt --uid 10001 mrt \
    && mkdir -p /var/lib/mrt /app \
    && chown mrt:mrt /var/lib/mrt

WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY --chown=mrt:mrt . .
RUN DJANGO_SECRET_KEY=collectstatic-only ZK_HOSTS=unused python manage.py collectstatic --noinput

USER mrt
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "mrtadmin.asgi:application"]
