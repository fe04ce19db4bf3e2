from django.apps import AppConfig


class IdentitiesConfig(AppConfig):
    name = "apps.identities"
    label = "identities"
    default_auto_field = "django.db.models.BigAutoField"
