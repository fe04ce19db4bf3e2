from django.db import connection

from apps.llm.models import Provider
from tests.factories import ProviderFactory


def test_provider_key_is_encrypted_at_rest_and_decrypted_on_read(org):
    provider = ProviderFactory(organization=org, api_key="sk-live-very-secret")

    with connection.cursor() as cursor:
        cursor.execute("SELECT api_key FROM llm_provider WHERE id = %s", [provider.id])
        stored = cursor.fetchone()[0]

    assert "sk-live-very-secret" not in stored
    assert stored.startswith("fernet:")
    assert Provider.objects.for_org(org.id).get(id=provider.id).api_key == "sk-live-very-secret"


def test_an_empty_secret_reads_back_empty(org):
    provider = ProviderFactory(organization=org, api_key="")

    assert Provider.objects.for_org(org.id).get(id=provider.id).api_key == ""
