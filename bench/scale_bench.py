"""Figures at scale (issue 25): one organisation with 10,000 agents, 1,000,000 messages and 1,000,000
archival passages (bench/scale_data.py seeds it once and keeps it), measured in this process:

- archival search top-10 over the 1M-passage archive: the database query alone with a pre-computed
  vector (`passage_search_queryset` under `filtered_vector_scan`, what `passage_search` runs), the
  selector with the query embedded by the bench LLM server (`passage_search`), and the API endpoint
  (GET /v1/agents/{id}/archival-memory/search through DRF's test client, Bearer key);
- recall search (hybrid: full text + vector, fused) on the agent with 100,000 messages;
- GET /v1/agents: the first page (default limit) and deep pages (`after` cursors 5,000 and 9,949
  agents in), and GET /v1/agents/{id} (the big agent and ordinary ones);
- a turn (one LLM call, in-process: `run_create` + `execute_run_streamed`, as a worker runs it) on the
  big agent against a new agent with the same 40 in-context messages and an empty new agent, in
  interleaved rounds; the big agent's rows are put back afterwards;
- the ADE's agent page and its context viewer, Django's test client signed in as a member.

Every figure is p50/p95 of `per_run` calls in each of `runs` runs (median and spread of the runs), with
the statements each call ran and this process's CPU time per call (p50; PostgreSQL's is not in it);
EXPLAIN (ANALYZE, BUFFERS) of the search queries and the agent list page is kept in the results
(bench/results/scale.json).

    make bench-scale          (DATA_DIR=var/scale-bench; seeds first when needed)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # One key makes every request: the rates must not be what is measured.
    os.environ.setdefault("API_RATE_PER_KEY", "1000000/min")
    os.environ.setdefault("API_RATE_PER_ORG", "1000000/min")
    import django

    django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import reverse  # noqa: E402

from apps.accounts.models import ApiKey, Membership, User  # noqa: E402
from apps.accounts.services import api_key_create  # noqa: E402
from apps.agents.models import Agent, Message  # noqa: E402
from apps.agents.recall import _keyword_ranking, conversation_search, message_nearest, recall_queryset  # noqa: E402
from apps.agents.services import MessageIn, agent_create, agent_delete  # noqa: E402
from apps.core.actor import Role  # noqa: E402
from apps.memory.archival import filtered_vector_scan, passage_search, passage_search_queryset  # noqa: E402
from bench import scale_data  # noqa: E402
from bench.inprocess import one_turn  # noqa: E402
from bench.stack import free_port  # noqa: E402
from bench.stats import across, machine_speed_ms, percentile  # noqa: E402
from bench.turns import SIMPLE  # noqa: E402
from tests.support.scripted_llm import embed_text  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "scale.json"
VOCABULARY_SIZE = scale_data.VOCABULARY_SIZE


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", flush=True)


def query_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"topic{rng.randrange(VOCABULARY_SIZE)}" for _ in range(3)) for _ in range(count)]


def measure(fn: Callable[[int], Any], *, runs: int, per_run: int) -> dict[str, Any]:
    """`runs` runs of `per_run` timed calls (after one warm-up): median and spread of the runs' p50 and
    p95, and the statements of one call."""
    with CaptureQueriesContext(connection) as captured:
        fn(0)
    statements = sorted(captured.captured_queries, key=lambda q: -float(q["time"]))
    p50s, p95s, cpu_p50s, speeds, counter = [], [], [], [], 0
    for _ in range(runs):
        speeds.append(machine_speed_ms(repeats=3)["min"])
        samples, cpu = [], []
        for _ in range(per_run):
            counter += 1
            started, cpu_started = time.perf_counter(), time.process_time()
            fn(counter)
            samples.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu_started) * 1000)
        p50s.append(percentile(samples, 50))
        p95s.append(percentile(samples, 95))
        cpu_p50s.append(percentile(cpu, 50))
    return {
        "p50_ms": across(p50s),
        "p95_ms": across(p95s),
        # This process's CPU (Django and the client, not PostgreSQL's): what a loaded machine distorts least.
        "cpu_p50_ms": across(cpu_p50s),
        # The machine's speed before each run (bench.stats.machine_speed_ms: lower is faster; about 8 ms
        # on a quiet one): these virtual machines' speed moves by a third within a minute with their
        # neighbours', so a figure is read with the speed it was measured at.
        "speed_ms": across(speeds),
        "n": runs * per_run,
        "statements": len(statements),
        "slowest_statements": [{"ms": round(float(q["time"]) * 1000, 2), "sql": q["sql"][:300]} for q in statements[:3]],
    }  # fmt: skip


def released(response: Any) -> None:
    """Django's test client ties each response to itself (`response.json` is a partial of it), a cycle
    the served platform does not make: it kept every page's data until the garbage collector's next pass,
    whose walks then cost the bench's requests what daphne's never pay (0.5-1.2 ms of a list page)."""
    response.__dict__.pop("json", None)


def explain(queryset: Any) -> str:
    return str(queryset.explain(analyze=True, buffers=True))


# --- figures -------------------------------------------------------------------------------------------


def archival_figures(data: scale_data.ScaleData, client: Any, *, runs: int, per_run: int) -> dict[str, Any]:
    actor, archive = data.actor, data.archive_id
    # Each figure searches its own texts, after a warm-up pass over others: the graph (~2 GB at 1M) does not
    # fit in shared_buffers, so a figure re-running the previous one's queries would read pages it left
    # warm (db_only, measured first on the same texts, was 410 ms against the selector's 24 ms).
    count = runs * per_run + 1
    warm, db_texts, selector_texts, api_texts = (query_texts(count, seed=seed) for seed in (10, 11, 13, 14))
    vectors = [embed_text(t, scale_data.DIMENSION) for t in db_texts]

    def database_only(i: int, embedded: list[list[float]] = vectors) -> None:
        with filtered_vector_scan(limit=10):
            rows = list(passage_search_queryset(actor=actor, archive_ids=[archive], embedding=embedded[i]))
        assert len(rows) == 10, len(rows)

    def selector(i: int) -> None:
        found = passage_search(
            actor=actor,
            archive_ids=[archive],
            query=selector_texts[i],
            embedding_handle=scale_data.EMBEDDING_HANDLE,
        )
        assert len(found) == 10, len(found)

    def api(i: int) -> None:
        response = client.get(
            f"/v1/agents/{data.big_agent_id}/archival-memory/search", {"query": api_texts[i], "top_k": 10}
        )
        assert response.status_code == 200, response.content[:300]
        assert len(response.json()["results"]) == 10, response.content[:300]
        released(response)

    warm_vectors = [embed_text(t, scale_data.DIMENSION) for t in warm]
    for i in range(len(warm_vectors)):
        database_only(i, warm_vectors)
    with filtered_vector_scan(limit=10):
        plan = explain(passage_search_queryset(actor=actor, archive_ids=[archive], embedding=vectors[0]))
    return {
        "passages_in_archive": scale_data.Sizes().passages if not data.sizes else data.sizes["passages"],
        "uses_hnsw": scale_data.PASSAGE_INDEX in plan,
        "explain": plan,
        "db_only": measure(database_only, runs=runs, per_run=per_run),
        "selector": measure(selector, runs=runs, per_run=per_run),
        "api": measure(api, runs=runs, per_run=per_run),
    }


def recall_figures(data: scale_data.ScaleData, *, runs: int, per_run: int) -> dict[str, Any]:
    actor, agent_id = data.actor, data.big_agent_id
    texts = query_texts(runs * per_run + 1, seed=12)

    def search(i: int) -> None:
        assert conversation_search(actor=actor, agent_id=agent_id, query=texts[i], limit=10)

    base = recall_queryset(actor=actor, agent_id=agent_id, conversation_id=None)
    vector = embed_text(texts[0], scale_data.DIMENSION)
    keyword_plan = explain(_keyword_ranking(base, texts[0])[:50])
    with filtered_vector_scan(limit=50):  # conversation_search's candidate pool for a limit of 10
        vector_plan = explain(message_nearest(base, embedding=vector).values_list("id", flat=True)[:50])
    return {
        "messages_of_agent": Message.all_objects.filter(agent_id=agent_id).count(),
        "vector_uses_hnsw": f"message_emb_{scale_data.DIMENSION}_hnsw" in vector_plan,
        "explain_keywords": keyword_plan,
        "explain_vector": vector_plan,
        "hybrid": measure(search, runs=runs, per_run=per_run),
    }


def agent_api_figures(data: scale_data.ScaleData, client: Any, *, runs: int, per_run: int) -> dict[str, Any]:
    ordered = list(
        Agent.all_objects.filter(organization_id=data.organization_id)
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)
    )
    some = random.Random(3).sample(ordered, min(50, len(ordered)))
    middle, last = len(ordered) // 2, len(ordered) - 51  # 5,000 and 9,949 agents in, at 10,000

    # The client sends no User-Agent: a 1.x client to Letta, as the SDK is, so an AgentState carries only
    # the relationships `include` names. EVERYTHING is a pre-1.0 client's User-Agent: every relationship.
    everything = {"HTTP_USER_AGENT": "python-requests/2.32.3"}

    def page(after: str | None, **headers: str) -> Callable[[int], None]:
        def call(_i: int) -> None:
            response = client.get("/v1/agents/", {"after": after} if after else {}, **headers)
            assert response.status_code == 200, response.content[:300]
            assert response.json(), "an empty page"
            released(response)

        return call

    def retrieve(agent_ids: list[str], **headers: str) -> Callable[[int], None]:
        def call(i: int) -> None:
            response = client.get(f"/v1/agents/{agent_ids[i % len(agent_ids)]}", **headers)
            assert response.status_code == 200, response.content[:300]
            released(response)

        return call

    with CaptureQueriesContext(connection) as captured:
        page(ordered[middle])(0)
    main = max(captured.captured_queries, key=lambda q: float(q["time"]))["sql"]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {main}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    return {
        "agents": len(ordered),
        "explain_deep_page": plan,
        "list_first_page": measure(page(None), runs=runs, per_run=per_run),
        "list_after_middle": measure(page(ordered[middle]), runs=runs, per_run=per_run),
        "list_after_last_full_page": measure(page(ordered[last]), runs=runs, per_run=per_run),
        "retrieve_big_agent": measure(retrieve([data.big_agent_id]), runs=runs, per_run=per_run),
        "retrieve_other_agents": measure(retrieve(some), runs=runs, per_run=per_run),
        "list_first_page_everything": measure(page(None, **everything), runs=runs, per_run=per_run),
        "retrieve_big_agent_everything": measure(
            retrieve([data.big_agent_id], **everything), runs=runs, per_run=per_run
        ),
        "page_bytes": {
            "sdk": len(client.get("/v1/agents/").content),
            "everything": len(client.get("/v1/agents/", **everything).content),
        },
    }


def turn_figures(data: scale_data.ScaleData, *, runs: int, per_run: int) -> dict[str, Any]:
    """Interleaved rounds of `per_run` one-call turns on each agent; the big agent is put back after."""
    actor, big = data.actor, data.big_agent_id
    saved_ids = list(Agent.all_objects.get(id=big).message_ids)
    last_sequence = Message.all_objects.filter(agent_id=big).order_by("-sequence_id").values_list("sequence_id", flat=True).first()  # fmt: skip
    context = [Message.all_objects.get(id=i) for i in saved_ids]
    same = agent_create(
        actor=actor,
        name="scale-fresh-same-context",
        model=scale_data.MODEL,
        embedding=scale_data.EMBEDDING_HANDLE,
        initial_messages=[MessageIn(role=m.role, content=m.text) for m in context],
    )
    empty = agent_create(
        actor=actor, name="scale-fresh-empty", model=scale_data.MODEL, embedding=scale_data.EMBEDDING_HANDLE
    )
    agents = {"big_100k_stored": big, "new_same_context": same.id, "new_empty": empty.id}
    samples: dict[str, list[list[float]]] = {name: [] for name in agents}
    statements: dict[str, int] = {}
    try:
        for name, agent_id in agents.items():  # warm-up, and the statements of one turn
            one_turn(actor, agent_id, SIMPLE, 0)
            with CaptureQueriesContext(connection) as captured:
                one_turn(actor, agent_id, SIMPLE, 1)
            statements[name] = len(captured.captured_queries)
        for run in range(runs):
            for name, agent_id in agents.items():
                times = []
                for i in range(per_run):
                    started = time.perf_counter()
                    one_turn(actor, agent_id, SIMPLE, 100 * run + i)
                    times.append((time.perf_counter() - started) * 1000)
                samples[name].append(times)
    finally:
        Agent.all_objects.filter(id=big).update(message_ids=saved_ids)
        Message.all_objects.filter(agent_id=big, sequence_id__gt=last_sequence).delete()
        for agent_id in (same.id, empty.id):
            agent_delete(actor=actor, agent_id=agent_id)
    out: dict[str, Any] = {}
    for name, per_round in samples.items():
        out[name] = {
            "p50_ms": across([percentile(t, 50) for t in per_round]),
            "p95_ms": across([percentile(t, 95) for t in per_round]),
            "n": sum(len(t) for t in per_round),
            "statements": statements[name],
        }
    ratio = [
        statistics.median(b) / statistics.median(s)
        for b, s in zip(samples["big_100k_stored"], samples["new_same_context"], strict=True)
    ]
    out["big_vs_same_context_ratio"] = across(ratio, 3)
    ratio_empty = [
        statistics.median(b) / statistics.median(s)
        for b, s in zip(samples["big_100k_stored"], samples["new_empty"], strict=True)
    ]
    out["big_vs_empty_ratio"] = across(ratio_empty, 3)
    return out


def ade_figures(data: scale_data.ScaleData, *, runs: int, per_run: int) -> dict[str, Any]:
    member, _ = User.objects.get_or_create(username="scale-bench-member")
    Membership.objects.get_or_create(
        user=member, organization_id=data.organization_id, defaults={"role": Role.MEMBER}
    )
    client = Client(SERVER_NAME="localhost")
    client.force_login(member)
    page_url = reverse("ade:workspace", kwargs={"agent_id": data.big_agent_id})
    context_url = reverse("ade:memory-context", kwargs={"agent_id": data.big_agent_id})

    def get(url: str, **headers: Any) -> Callable[[int], None]:
        def call(_i: int) -> None:
            response = client.get(url, **headers)
            assert response.status_code == 200, response.status_code
            released(response)

        return call

    return {
        "agent_page": measure(get(page_url), runs=runs, per_run=per_run),
        "context_viewer": measure(get(context_url, HTTP_HX_REQUEST="true"), runs=runs, per_run=per_run),
    }


# --- main ----------------------------------------------------------------------------------------------


def _llm_server() -> tuple[subprocess.Popen[bytes], str]:
    from bench.llm_server import BenchLLMClient

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.llm_server", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not BenchLLMClient(root).healthy():
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise RuntimeError("the bench LLM server did not start")
        time.sleep(0.2)
    return process, root


FIGURES = ("archival", "recall", "agents", "turns", "ade")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reseed", action="store_true", help="delete the seeded organisation and seed again")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the seed's counts (a smoke test)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-run", type=int, default=30)
    parser.add_argument("--turns-per-run", type=int, default=5)
    parser.add_argument("--only", default=",".join(FIGURES), help=f"subset of {','.join(FIGURES)}")
    parser.add_argument("--no-seed", action="store_true", help="measure what is there, seed nothing")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    only = {p.strip() for p in args.only.split(",") if p.strip()}
    started = time.monotonic()
    sizes = scale_data.Sizes().scaled(args.scale) if args.scale != 1 else scale_data.Sizes()
    data = scale_data.seed(sizes=sizes, reseed=args.reseed, only=() if args.no_seed else None, log=log)
    log(f"seeded: {data.sizes}, stage seconds {data.seconds}")
    results: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "load_at_start": list(os.getloadavg()),
        "seed": {"sizes": data.sizes, "stage_seconds": data.seconds},
        "config": {"runs": args.runs, "per_run": args.per_run, "turns_per_run": args.turns_per_run},
    }
    process, root = _llm_server()
    settings.OPENAI_BASE_URL = f"{root}/v1"
    settings.OPENAI_API_KEY = "sk-bench"
    from rest_framework.test import APIClient

    user = User.objects.get(id=data.user_id)
    key = api_key_create(actor=data.actor, user=user, name="scale-bench")
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key.raw_key}")
    kw = {"runs": args.runs, "per_run": args.per_run}
    try:
        for name, figure in (
            ("archival", lambda: archival_figures(data, client, **kw)),
            ("recall", lambda: recall_figures(data, **kw)),
            ("agents", lambda: agent_api_figures(data, client, **kw)),
            ("turns", lambda: turn_figures(data, runs=args.runs, per_run=args.turns_per_run)),
            ("ade", lambda: ade_figures(data, **kw)),
        ):
            if name not in only:
                continue
            log(f"--- {name}")
            t = time.monotonic()
            results[name] = figure()
            log(json.dumps(_brief(results[name]))[:1500])
            results.setdefault("seconds", {})[name] = round(time.monotonic() - t, 1)
    finally:
        process.terminate()
        process.wait(10)
        ApiKey.all_objects.filter(id=key.api_key.id).delete()
    results["load_at_end"] = list(os.getloadavg())
    results["total_seconds"] = round(time.monotonic() - started, 1)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2))
    log(f"wrote {args.output} ({results['total_seconds']} s)")
    return 0


def _brief(value: Any) -> Any:
    """The figures without plans and statements, for the log."""
    if isinstance(value, dict):
        return {
            k: _brief(v)
            for k, v in value.items()
            if not k.startswith("explain") and k not in ("slowest_statements", "runs")
        }
    return value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
