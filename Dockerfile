# The console and the consumer daemons: one image, the command picks the role.
#   web:      daphne -b 0.0.0.0 -p 8000 mrtadmin.asgi:application   (the default)
#   daemons:  python manage.py runconsumer all
# ZK_HOSTS must point at the ensemble; the image carries no ZooKeeper of its own.
# Debian's Python 3.11 on the same base as the ZooKeeper and Redis images (docker/).
FROM debian:bookworm-slim

# PEM certificates to trust in addition to Debian's, for a build machine whose HTTPS goes
# through an intercepting proxy (bin/compose-check passes the host's own); empty elsewhere.
ARG EXTRA_CA_CERTS=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    MRT_VAR_DIR=/var/lib/mrt \
    DJANGO_STATIC_ROOT=/app/staticfiles

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/build-extra.crt \
        && update-ca-certificates; \
    fi \
    && python3 -m venv /opt/venv \
    && useradd --system --create-home --home-dir /home/mrt --uid 10001 mrt \
    && mkdir -p /var/lib/mrt /app \
    && chown mrt:mrt /var/lib/mrt

WORKDIR /app
COPY requirements.txt .
# pip checks certificates against Debian's bundle (plus EXTRA_CA_CERTS), not its own copy.
RUN PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    pip install --no-cache-dir --disable-pip-version-check -r requirements.txt
COPY --chown=mrt:mrt . .
RUN DJANGO_SECRET_KEY=collectstatic-only ZK_HOSTS=unused python manage.py collectstatic --noinput

USER mrt
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "mrtadmin.asgi:application"]
