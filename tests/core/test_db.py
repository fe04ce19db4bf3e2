"""apps.core.db.fetch_instances: hand-written SELECTs on hot paths must build what the ORM builds."""

from django.db import models

from apps.agents.models import Message
from apps.core.db import fetch_instances
from apps.llm.models import Provider
from tests.factories import MessageFactory, ProviderFactory


def field_values(instance: models.Model) -> dict[str, object]:
    return {
        field.attname: getattr(instance, field.attname)
        for field in instance._meta.concrete_fields
        if field.attname not in instance.get_deferred_fields()
    }


def test_rows_convert_as_the_orm_converts_them(org):
    provider = ProviderFactory(organization=org, api_key="sk-live-secret")
    message = MessageFactory(
        organization=org,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    )

    [read_provider] = fetch_instances(
        Provider, "SELECT {columns} FROM llm_provider AS p WHERE p.id = %s", [provider.id], alias="p"
    )
    [read_message] = fetch_instances(
        Message,
        "SELECT {columns} FROM agents_message AS m WHERE m.id = %s",
        [message.id],
        alias="m",
        exclude=frozenset({"embedding"}),
    )

    assert read_provider.api_key == "sk-live-secret"  # decrypted
    assert field_values(read_provider) == field_values(Provider.objects.for_org(org.id).get(id=provider.id))
    assert read_message.tool_calls[0]["function"]["name"] == "f"  # JSON parsed
    assert read_message.get_deferred_fields() == {"embedding"}
    orm_message = Message.objects.for_org(org.id).defer("embedding").get(id=message.id)
    assert field_values(read_message) == field_values(orm_message)
    assert not read_message._state.adding  # a stored row: save() updates it
