"""Where the git-memory tag is saved, the repository is built (and the blocks move under `system/`) once
the saving transaction commits: agent_create and agent_update (the API and the ADE go through them) and
the Django admin's agent form."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from apps.agents.services import BlockSpec, agent_create, agent_update
from apps.memory.models import Block, GitMemoryRepo
from tests.admin.html_form import form_data

pytestmark = pytest.mark.django_db

TAG = "git-memory-enabled"


def labels(agent_id: str) -> list[str]:
    return sorted(
        Block.objects.unscoped().filter(agent_attachments__agent_id=agent_id).values_list("label", flat=True)
    )


def test_the_services_build_the_repository_when_the_tag_is_saved(actor, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        tagged = agent_create(
            actor=actor, name="a", memory_blocks=[BlockSpec(label="human", value="x")], tags=[TAG]
        )
        plain = agent_create(actor=actor, name="b", memory_blocks=[BlockSpec(label="human", value="y")])
    untouched = labels(plain.id)
    with django_capture_on_commit_callbacks(execute=True):
        agent_update(actor=actor, agent_id=plain.id, description="no tag yet")
    still = labels(plain.id)
    with django_capture_on_commit_callbacks(execute=True):
        agent_update(actor=actor, agent_id=plain.id, tags=[TAG, "other"])

    assert labels(tagged.id) == ["system/human"]
    assert untouched == still == ["human"]
    assert labels(plain.id) == ["system/human"]
    assert GitMemoryRepo.objects.unscoped().filter(agent_id__in=[tagged.id, plain.id]).count() == 2


def test_the_admin_builds_the_repository_when_the_tag_is_saved(
    client, actor, user, django_capture_on_commit_callbacks
):
    user.is_staff = True
    user.save()
    user.user_permissions.set(Permission.objects.all())
    with django_capture_on_commit_callbacks(execute=True):
        agent = agent_create(actor=actor, name="a", memory_blocks=[BlockSpec(label="human", value="x")])
    client.force_login(user)
    url = reverse("admin:agents_agent_change", args=[agent.id])
    data = form_data(client.get(url).content.decode(), "agent_form")
    data["tags"] = [TAG]

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, data)

    assert response.status_code == 302
    assert labels(agent.id) == ["system/human"]
    assert GitMemoryRepo.objects.unscoped().filter(agent_id=agent.id).exists()
