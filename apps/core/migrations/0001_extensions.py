"""PostgreSQL extensions the platform needs, created by migrations so no manual step is required."""

from django.db import migrations
from pgvector.django import VectorExtension


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []

    operations = [
        VectorExtension(),
    ]
