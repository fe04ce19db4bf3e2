from django.apps import AppConfig


class FoldersConfig(AppConfig):
    name = "apps.folders"
    label = "folders"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The file tools and the `<directories>` section are the agent loop's, but built here (the loop
        must not import this app): register them with it."""
        from apps.folders import tools

        tools.register()
