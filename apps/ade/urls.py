"""The ADE's pages. Each area's module owns its patterns (views/<area>.py)."""

from apps.ade.views import (
    account,
    agents,
    archives,
    auth,
    folders,
    git_memory,
    groups,
    identities,
    invitations,
    llm_calls,
    runs,
    tools,
    workspace,
)

app_name = "ade"

urlpatterns = [
    *auth.urlpatterns,
    *account.urlpatterns,
    *invitations.urlpatterns,
    *agents.urlpatterns,
    *workspace.urlpatterns,
    *tools.urlpatterns,
    *folders.urlpatterns,
    *archives.urlpatterns,
    *identities.urlpatterns,
    *runs.urlpatterns,
    *llm_calls.urlpatterns,
    *groups.urlpatterns,
    *git_memory.urlpatterns,
]
