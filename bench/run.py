"""Benchmarks of what exists so far; `make bench` runs this against the embedded services.

Prints a table (median and spread of repeated runs, with the machine's core count) and writes
bench/results/latest.json. Later issues add agent turns, throughput, streaming and sandbox figures.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.db import connection  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from apps.accounts.models import Membership, Organization, User  # noqa: E402
from apps.accounts.services import api_key_create  # noqa: E402
from apps.core.actor import Actor, Role  # noqa: E402
from apps.memory import services as memory_services  # noqa: E402
from apps.memory.models import Archive, Passage  # noqa: E402
from apps.memory.selectors import passage_nearest  # noqa: E402

PASSAGES = int(os.environ.get("BENCH_PASSAGES", "10000"))
DIMENSION = 384


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1], 3),
        "spread_ms": round(ordered[-1] - ordered[0], 3),
        "n": len(ordered),
    }


def random_unit_vector(rng: random.Random) -> list[float]:
    vector = [rng.gauss(0, 1) for _ in range(DIMENSION)]
    norm = sum(v * v for v in vector) ** 0.5
    return [v / norm for v in vector]


def main() -> None:
    rng = random.Random(7)
    organization = Organization.objects.create(name=f"bench-{time.time_ns()}")
    user = User.objects.create_user(username=f"bench-{time.time_ns()}")
    Membership.objects.create(user=user, organization=organization, role=Role.OWNER)
    actor = Actor(organization_id=organization.id, user_id=user.id, role=Role.OWNER)
    results: dict[str, object] = {"cores": os.cpu_count(), "passages": PASSAGES, "dimension": DIMENSION}

    # API: a block read and a block write through DRF (in-process, no network).
    client = APIClient(SERVER_NAME="localhost")
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(actor=actor, user=user, name='bench').raw_key}"
    )
    block = memory_services.block_create(actor=actor, label="human", value="Name: Sam", limit=10_000)
    counter = iter(range(10**9))

    def get_block() -> None:
        assert client.get(f"/v1/blocks/{block.id}").status_code == 200

    def patch_block() -> None:
        response = client.patch(f"/v1/blocks/{block.id}", {"value": f"v{next(counter)}"}, format="json")
        assert response.status_code == 200

    get_block()  # warm up
    results["api_block_get"] = summary(timed(get_block, 300))
    results["api_block_patch"] = summary(timed(patch_block, 200))

    # Archival memory: bulk insert, then nearest-neighbour search through the HNSW index.
    archive = Archive.all_objects.create(organization=organization, name="bench", embedding_dim=DIMENSION)
    start = time.perf_counter()
    batch = [
        Passage(
            organization=organization,
            archive=archive,
            text=f"passage {i}",
            embedding=random_unit_vector(rng),
            embedding_dim=DIMENSION,
        )
        for i in range(PASSAGES)
    ]
    Passage.all_objects.bulk_create(batch, batch_size=1000)
    insert_seconds = time.perf_counter() - start
    results["archival_insert_passages_per_s"] = round(PASSAGES / insert_seconds, 1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory_passage")
    queries = [random_unit_vector(rng) for _ in range(200)]
    query_iter = iter(queries * 2)

    def search() -> None:
        list(passage_nearest(actor=actor, archive_ids=[archive.id], embedding=next(query_iter), top_k=10))

    search()
    results[f"archival_search_{PASSAGES}"] = summary(timed(search, 200))
    plan = passage_nearest(actor=actor, archive_ids=[archive.id], embedding=queries[0], top_k=10).explain()
    results["archival_search_uses_hnsw"] = "hnsw" in plan

    Organization.objects.filter(id=organization.id).delete()
    User.objects.filter(id=user.id).delete()
    print_table(results)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    (out / "latest.json").write_text(json.dumps({"commit": commit.strip(), **results}, indent=2))


def print_table(results: dict[str, object]) -> None:
    print(f"\nmachine: {results['cores']} cores")
    print(f"{'figure':40} {'p50 ms':>10} {'p95 ms':>10} {'spread':>10} {'n':>6}")
    for name, value in results.items():
        if isinstance(value, dict):
            print(
                f"{name:40} {value['p50_ms']:>10} {value['p95_ms']:>10} {value['spread_ms']:>10} {value['n']:>6}"
            )
    for name, value in results.items():
        if not isinstance(value, dict) and name != "cores":
            print(f"{name:40} {value}")


if __name__ == "__main__":
    main()
