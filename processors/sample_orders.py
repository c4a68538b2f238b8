"""Sample orders for the example processors (demo, tests): deterministic, ~10% void orders."""
from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Iterator

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
CURRENCIES = ("EUR", "USD", "GBP", "JPY")


def order(i: int, rng: random.Random) -> dict:
    amount = round(rng.uniform(1, 250), 2) if rng.random() >= 0.1 else -round(rng.uniform(0, 10), 2)
    return {
        "id": f"order-{i:09d}",
        "customer_id": f"customer-{rng.randrange(100_000):06d}",
        "amount": amount,
        "currency": CURRENCIES[i % len(CURRENCIES)],
        "created_at": EPOCH + timedelta(milliseconds=i * 37),
        "items": rng.randrange(1, 9),
        "note": None if rng.random() < 0.8 else "gift wrap, please",
    }


def orders(count: int, seed: int = 7, first: int = 0) -> Iterator[dict]:
    rng = random.Random(seed)
    for i in range(first, first + count):
        yield order(i, rng)


def enriched(o: dict) -> dict | None:
    """What EnrichOrders publishes for order `o` (None: filtered out)."""
    if not o["amount"] > 0:
        return None
    return {"id": o["id"], "customer_id": o["customer_id"], "amount_cents": int(o["amount"] * 100),
            "currency": o["currency"], "created_at": o["created_at"], "items": o["items"],
            "is_large": o["amount"] > 100}
