from django.apps import AppConfig


class StreamsConfig(AppConfig):
    name = "apps.streams"
    label = "streams"
    default_auto_field = "django.db.models.BigAutoField"
