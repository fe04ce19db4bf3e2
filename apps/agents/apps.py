from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "apps.agents"
    label = "agents"
    default_auto_field = "django.db.models.BigAutoField"
