"""`manage.py export_dataset` (JSONL with loss masks and token data) and `manage.py eval DATASET AGENT`."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from apps.agents.models import Step
from apps.agents.services import step_set_feedback
from tests.support.scripted_llm import text, token_id, tool_call, tool_calls

pytestmark = pytest.mark.django_db


def export(tmp_path, org, *args: str) -> list[dict]:
    out = tmp_path / "runs.jsonl"
    call_command("export_dataset", org.name, "--output", str(out), *args)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_runs_export_with_loss_masks_tool_calls_token_ids_and_feedback_filters(
    tmp_path, org, actor, make_agent, send, llm
):
    agent, other = make_agent(), make_agent(name="Other")
    args = {"label": "human", "new_string": "Likes tea"}
    llm.push(tool_calls(tool_call("memory_insert", args)), text("Noted tea"), text("Bye"), text("Elsewhere"))
    kept = send(agent, "I like tea", return_token_ids=True, return_logprobs=True)
    send(agent, "bye")
    send(other, "hello")
    step_set_feedback(
        actor=actor, step_id=Step.all_objects.filter(run=kept.run).first().id, feedback="positive"
    )

    everything = export(tmp_path, org)
    positive = export(tmp_path, org, "--feedback", "positive")
    of_agent = export(tmp_path, org, "--agent", agent.id)

    assert len(everything) == 3
    assert [r["agent_id"] for r in of_agent] == [agent.id, agent.id]
    [row] = positive
    assert row["run_id"] == kept.run.id
    assert [(m["role"], m["loss_mask"]) for m in row["messages"]] == [
        ("user", 0),
        ("assistant", 1),
        ("tool", 0),
        ("assistant", 1),
    ]
    assert row["tool_calls"] == [{"name": "memory_insert", "arguments": json.dumps(args)}]
    assert [(t["role"], t["loss_mask"]) for t in row["turns"]] == [
        ("assistant", 1),
        ("tool", 0),
        ("assistant", 1),
    ]
    assert row["turns"][2]["output_ids"] == [token_id("Noted"), token_id(" tea")]
    assert [s["feedback"] for s in row["steps"]] == ["positive", None]
    assert everything[1]["turns"] == []  # no token ids asked for


def test_eval_replays_user_turns_and_reports_matches_and_a_mismatch(tmp_path, make_agent, llm, capsys):
    agent = make_agent()
    dataset = tmp_path / "cases.jsonl"
    rows = [
        {
            "run_id": "case-tea",
            "messages": [
                {"role": "user", "content": "I like tea"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "memory_insert", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                {"role": "assistant", "content": "Noted tea"},
            ],
        },
        {
            "run_id": "case-hi",
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}],
        },
    ]
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    llm.push(
        tool_calls(tool_call("memory_insert", {"label": "human", "new_string": "Likes tea"})),
        text("Noted tea"),
        text("Howdy"),
    )

    with pytest.raises(SystemExit) as exited:
        call_command("eval", str(dataset), agent.id)

    out = capsys.readouterr().out
    assert exited.value.code == 1
    assert "MATCH case-tea: 'I like tea'" in out
    assert "MISMATCH case-hi: 'hi'" in out
    assert "answer: expected 'Hello!', got 'Howdy'" in out
    assert out.strip().endswith("1 matched, 1 did not, of 2")
    assert [r["messages"][-1]["content"] for r in llm.chat_requests()][-1] == "hi"


def test_eval_refuses_a_dataset_that_is_not_jsonl(tmp_path, make_agent):
    agent = make_agent()
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text("not json\n")

    with pytest.raises(Exception, match="line 1: not JSON"):
        call_command("eval", str(dataset), agent.id)


def test_runs_export_as_parquet_with_the_same_rows(tmp_path, org, make_agent, send, llm):
    import pyarrow.parquet as pq

    agent = make_agent()
    llm.push(text("Hello there"))
    result = send(agent, "hi", return_token_ids=True)
    out = tmp_path / "runs.parquet"

    call_command("export_dataset", org.name, "--format", "parquet", "--output", str(out))

    [row] = pq.read_table(out).to_pylist()
    assert row["run_id"] == result.run.id
    assert [m["loss_mask"] for m in json.loads(row["messages"])] == [0, 1]
    assert json.loads(row["turns"])[0]["output_ids"] == [token_id("Hello"), token_id(" there")]


def test_the_dataset_endpoint_streams_runs_as_jsonl_filtered_and_only_the_callers(
    api_client_for, actor, other_org_actor, make_agent, send, llm
):
    agent, other = make_agent(), make_agent(name="Other")
    llm.push(text("one"), text("two"))
    first = send(agent, "first")
    send(other, "second")
    step_set_feedback(actor=actor, step_id=Step.all_objects.get(run=first.run).id, feedback="negative")
    client = api_client_for(actor)

    response = client.get("/v1/datasets/runs", {"feedback": "negative"})
    of_agent = client.get("/v1/datasets/runs", {"agent_id": other.id, "limit": 5})
    too_many = client.get("/v1/datasets/runs", {"limit": 5000})
    theirs = api_client_for(other_org_actor).get("/v1/datasets/runs")

    rows = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert response["Content-Type"] == "application/x-ndjson"
    assert [r["run_id"] for r in rows] == [first.run.id]
    assert rows[0]["messages"][-1] == {"role": "assistant", "content": "one", "loss_mask": 1}
    assert len(b"".join(of_agent.streaming_content).decode().splitlines()) == 1
    assert too_many.status_code == 422
    assert b"".join(theirs.streaming_content) == b""
