# The app image: web (daphne with a graceful drain, config/serve.py), Celery worker and beat all run
# from it (see docker-compose.yml), and the sandbox runner.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# iptables: the sandbox runner installs and verifies the egress filter of network-enabled tools with it
# (apps/sandbox/egress.py), in the host's network namespace (docker-compose.yml). Debian's package has
# both backends: `iptables` (nft, the default) and `iptables-legacy` (SANDBOX_EGRESS_IPTABLES).
RUN apt-get update && apt-get install -y --no-install-recommends iptables && rm -rf /var/lib/apt/lists/*

COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

# The app user and its group have fixed ids: the runner gives its Unix socket to group 10001
# (SANDBOX_RUNNER_SOCKET_GID in docker-compose.yml). /run/letta-sandbox is where that socket lives; a
# new `sandbox-socket` volume takes this directory's owner and mode (root, group app, 0750).
COPY . .
RUN DJANGO_SECRET_KEY=build DATABASE_URL=postgres://x@localhost/x REDIS_URL=redis://localhost \
    python manage.py collectstatic --noinput --verbosity 0 \
    && groupadd --system --gid 10001 app && useradd --system --uid 10001 --gid app app \
    && chown -R app /app && install -d -m 0750 -o root -g app /run/letta-sandbox
USER app

EXPOSE 8283
CMD ["python", "-m", "config.serve", "-b", "0.0.0.0", "-p", "8283", "config.asgi:application"]
