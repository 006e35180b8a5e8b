"""/metrics, rendered once per snapshot instead of once per scrape.

Formatting the exposition text costs about 10 µs per series in prometheus_client, milliseconds for a
node with hundreds of series. The output only changes when the sampler publishes a new snapshot, so
each format is rendered once per snapshot and every scrape in between gets the same bytes. The text
format is rendered ahead of time, in the sampler's thread, for the cycles just before the next scrape
is due (learnt from the last two scrapes), so a scrape rarely waits for formatting and a node scraped
every 30 s does not format its series every second.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric

from gpulens.agent.snapshot import Snapshot, SnapshotSource

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

# What a scraper that asks for no particular format gets (Prometheus's classic text format).
_, TEXT = choose_encoder("")


class ExpositionCache:
    name = "exposition"

    def __init__(
        self, registry: CollectorRegistry, sampler: SnapshotSource, monotonic: Callable[[], float] = time.monotonic
    ):
        self._registry = registry
        self._sampler = sampler
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._bodies: dict[tuple[str, bool], bytes] = {}
        self._scrapes: deque[float] = deque(maxlen=2)  # when the last two scrapes came (monotonic s)

    def record(self, snapshot: Snapshot, now: float) -> None:
        """Render the text format for a freshly published snapshot when a scrape is due soon
        (runs in the sampler's thread, after each cycle)."""
        if self.scrape_due():
            self.body(TEXT, gzipped=False, snapshot=snapshot)

    def scrape_due(self) -> bool:
        """Return whether the next scrape is expected within two sampling cycles."""
        if len(self._scrapes) < 2:
            return True  # the scrape rhythm is not known yet
        period = self._scrapes[1] - self._scrapes[0]
        since = self._monotonic() - self._scrapes[1]
        lead = 2 * self._sampler.clock.wall_seconds(self._sampler.interval)
        # Past three periods the scraper has gone away: stop rendering until it is back.
        return period - lead <= since <= 3 * period + lead

    def body(self, content_type: str, gzipped: bool, snapshot: Snapshot | None = None) -> bytes:
        """Return the exposition of the latest (or the given) snapshot in `content_type`."""
        snapshot = snapshot or self._sampler.snapshot
        key = (content_type, gzipped)
        with self._lock:
            if snapshot is self._snapshot and key in self._bodies:
                return self._bodies[key]
        encoder, _ = choose_encoder(_accept_for(content_type))
        data = encoder(self._registry)
        if gzipped:
            data = gzip.compress(data, compresslevel=6)
        with self._lock:
            if snapshot is not self._snapshot:
                self._snapshot, self._bodies = snapshot, {}
            self._bodies[key] = data
        return data

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """WSGI handler for /metrics: Prometheus text, or OpenMetrics when asked; gzip when accepted."""
        params = parse_qs(environ.get("QUERY_STRING", ""))
        if "name[]" in params:
            # A filtered scrape is rare and small: render it on its own, uncached.
            data = generate_latest(_Filtered(self._registry, set(params["name[]"])))
            start_response("200 OK", [("Content-Type", TEXT)])
            return [data]
        self._scrapes.append(self._monotonic())
        _, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        gzipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        data = self.body(content_type, gzipped)
        # Vary: a cache between here and the scraper keeps one answer per format and encoding asked for.
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(data))),
            ("Vary", "Accept, Accept-Encoding"),
        ]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [data]


def gzip_accepted(header: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (RFC 9110 12.5.3): named, or `*`, with a weight above 0;
    "gzip;q=0" refuses it, as does a `*;q=0` that gzip itself does not override."""
    weights = {}
    for item in header.lower().split(","):
        coding, _, parameters = item.partition(";")
        weight = 1.0
        for parameter in parameters.split(";"):
            name, _, value = parameter.strip().partition("=")
            if name == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0  # a weight that does not read: not taken as a yes
        weights[coding.strip()] = weight
    return weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0))) > 0


def _accept_for(content_type: str) -> str:
    """The Accept header that makes choose_encoder pick `content_type` again."""
    return content_type.split(";")[0] + "; version=1.0.0" if "openmetrics" in content_type else ""


class _Filtered:
    """The registry's families whose samples carry one of `names` (our collectors describe nothing,
    so prometheus_client's restricted registry cannot pick them by name)."""

    def __init__(self, registry: CollectorRegistry, names: set[str]):
        self._registry = registry
        self._names = names

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if s.name in self._names]
            if samples:
                family.samples = samples
                yield family
