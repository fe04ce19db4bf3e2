from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "apps.agents"
    label = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Celery's autodiscovery imports apps.agents.tasks only; the group turn's task lives apart.
        from apps.agents import group_tasks  # noqa: F401
