from django.apps import AppConfig


class FoldersConfig(AppConfig):
    name = "apps.folders"
    label = "folders"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The file tools and the `<directories>` section are the agent loop's, and the folders of agent files
        are apps.agents.agent_file's, but built here (the agents app must not import this one): register
        them with it."""
        from apps.agents import agent_file
        from apps.folders import services, tools

        tools.register()
        agent_file.register_folders(
            agent_file.FolderSection(
                export=services.agent_file_export_folders, import_=services.agent_file_import_folders
            )
        )
