from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "apps.memory"
    label = "memory"
    default_auto_field = "django.db.models.BigAutoField"
