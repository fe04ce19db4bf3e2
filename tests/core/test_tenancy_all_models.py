"""For every tenant model: organisation B's scoped queries never return organisation A's rows."""

import pytest
from django.apps import apps

from apps.core.models import OrgOwnedModel
from tests.admin.test_admin_pages import populated  # noqa: F401  (fixture: one row of every model in `org`)

TENANT_MODELS = sorted(
    (m for m in apps.get_models() if issubclass(m, OrgOwnedModel)), key=lambda m: m._meta.label
)


def test_every_tenant_model_is_covered():
    assert len(TENANT_MODELS) >= 14


@pytest.mark.parametrize("model", TENANT_MODELS, ids=lambda m: m._meta.label)
def test_other_organisation_cannot_read_list_change_or_delete(model, populated, actor, other_org_actor):  # noqa: F811
    row = model.all_objects.filter(organization_id=actor.organization_id).first()

    other_rows = model.objects.for_actor(other_org_actor)
    changed = other_rows.filter(pk=row.pk).update(updated_at=row.updated_at)
    deleted, _ = other_rows.filter(pk=row.pk).delete()

    assert model.objects.for_actor(actor).filter(pk=row.pk).exists()
    assert not other_rows.filter(pk=row.pk).exists()
    assert (changed, deleted) == (0, 0)
    assert model.all_objects.filter(pk=row.pk).exists()
