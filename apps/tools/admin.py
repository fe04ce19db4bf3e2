from django.contrib import admin

from apps.accounts.admin_base import OrgScopedAdmin
from apps.tools.models import Tool


@admin.register(Tool)
class ToolAdmin(OrgScopedAdmin):
    list_display = [
        "name",
        "tool_type",
        "default_requires_approval",
        "return_char_limit",
        "organization",
        "updated_at",
    ]
    list_filter = ["tool_type", "default_requires_approval"]
    search_fields = ["name", "description", "id"]
