from django.apps import AppConfig


class AdeConfig(AppConfig):
    name = "apps.ade"
    label = "ade"
    default_auto_field = "django.db.models.BigAutoField"
