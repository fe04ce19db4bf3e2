"""Migration agents 0004: the provider traces of existing steps move into the compressed column intact."""

import pytest

from apps.agents.models import Step
from tests.support.migrations import migrated_from


@pytest.mark.django_db(transaction=True)
def test_existing_traces_are_compressed_and_read_back_unchanged(make_agent):
    agent = make_agent(embedding="")
    request = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "héllo " * 200}]}
    response = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    with migrated_from([("agents", "0003_message_embedding")]) as (old_apps, forward):
        OldStep = old_apps.get_model("agents", "Step")
        traced = OldStep._default_manager.create(
            organization_id=agent.organization_id,
            agent_id=agent.id,
            request_json=request,
            response_json=response,
        )
        untraced = OldStep._default_manager.create(organization_id=agent.organization_id, agent_id=agent.id)
        forward([("agents", "0004_step_trace_compressed")])
        forward()  # the current model reads the columns of later migrations too

        step = Step.all_objects.get(id=traced.id)
        assert (step.request_json, step.response_json) == (request, response)
        assert len(bytes(step.trace)) < len(str(request)) / 4  # stored compressed
        assert Step.all_objects.get(id=untraced.id).trace is None
