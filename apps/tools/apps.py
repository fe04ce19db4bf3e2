from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "apps.tools"
    label = "tools"
    default_auto_field = "django.db.models.BigAutoField"
