from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db import connection

from apps.agents.models import Message
from tests.factories import MessageFactory


def test_full_text_search_over_messages_uses_the_gin_index(actor, org):
    hit = MessageFactory(organization=org, text="I love hiking in the Alps")
    MessageFactory(organization=org, agent=hit.agent, text="The weather is nice")
    queryset = (
        Message.objects.for_actor(actor)
        .annotate(search=SearchVector("text", config="english"))
        .filter(search=SearchQuery("hike", config="english"))
    )
    # Without the org filter the only index that can serve the query is the full-text one: this shows
    # the index expression matches what the ORM generates (on big tables the planner combines both).
    text_only = Message.objects.unscoped().annotate(search=SearchVector("text", config="english")).order_by()

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = text_only.filter(search=SearchQuery("hike", config="english")).explain()
    found = list(queryset.values_list("id", flat=True))

    assert found == [hit.id]  # stemming: "hike" finds "hiking"
    assert "message_text_fts" in plan
