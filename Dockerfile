# The app image: web (daphne), Celery worker and beat all run from it (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .
RUN DJANGO_SECRET_KEY=build DATABASE_URL=postgres://x@localhost/x REDIS_URL=redis://localhost \
    python manage.py collectstatic --noinput --verbosity 0 \
    && useradd --system --uid 10001 app && chown -R app /app
USER app

EXPOSE 8283
CMD ["daphne", "-b", "0.0.0.0", "-p", "8283", "config.asgi:application"]
