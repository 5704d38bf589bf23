"""Counters of the radix prefix cache: lookups, hits, insertions, evictions, hit-length distribution."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CacheMetrics:
    """Running counters, updated by ``RadixCache``; read them or call ``to_dict()``.

    ``hit_pages_log2[b]`` counts lookups whose hit was ``p`` pages with ``p.bit_length() == b``:
    bucket 0 is a miss, bucket 1 one page, bucket 2 two or three pages, bucket 3 four to seven, ...
    """

    lookups: int = 0
    lookup_tokens: int = 0  # tokens asked for by match()
    hit_tokens: int = 0
    inserted_tokens: int = 0  # tokens newly stored by insert()
    evicted_tokens: int = 0
    hit_pages_log2: list[int] = field(default_factory=lambda: [0] * 64)

    def record_lookup(self, tokens: int, hit_pages: int, page_size: int) -> None:
        """Count one ``match`` of ``tokens`` tokens that hit ``hit_pages`` pages."""
        self.lookups += 1
        self.lookup_tokens += tokens
        self.hit_tokens += hit_pages * page_size
        self.hit_pages_log2[hit_pages.bit_length()] += 1

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def hit_length_histogram(self) -> dict[str, int]:
        """Non-empty buckets as ``{"0": misses, "1": ..., "2-3": ..., "4-7": ...}`` (in pages)."""
        out = {}
        for b, count in enumerate(self.hit_pages_log2):
            if count:
                label = "0" if b == 0 else (str(1 << (b - 1)) if b == 1 else f"{1 << (b - 1)}-{(1 << b) - 1}")
                out[label] = count
        return out

    def to_dict(self) -> dict:
        return {
            "lookups": self.lookups,
            "lookup_tokens": self.lookup_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "inserted_tokens": self.inserted_tokens,
            "evicted_tokens": self.evicted_tokens,
            "hit_pages_histogram": self.hit_length_histogram(),
        }
