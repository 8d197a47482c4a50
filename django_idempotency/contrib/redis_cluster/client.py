"""Redis Cluster behind a django-redis cache alias: a client whose connection is RedisCluster."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

# django-redis ships no type information.
from django_redis.client import DefaultClient  # type: ignore[import-untyped]
from redis.cluster import ClusterNode, RedisCluster

if TYPE_CHECKING:
    from collections.abc import Collection

# One RedisCluster per set of nodes and options, shared by every thread of the process: each
# knows the cluster's slots and keeps a connection pool per node, which Django's per-thread
# cache objects would otherwise build again (a CLUSTER SLOTS round trip) in every thread.
_clusters: dict[tuple[Any, ...], RedisCluster] = {}
_lock = threading.Lock()


class RedisClusterClient(DefaultClient):  # type: ignore[misc]  # django-redis is untyped.
    """django-redis's client on a Redis Cluster, through redis-py's `RedisCluster`.

    Set it as the alias's `OPTIONS["CLIENT_CLASS"]`; the rest of the alias is configured as for
    one Redis: `LOCATION` names one node or several (every node is found from them), `OPTIONS`'
    timeouts, password and `REDIS_CLIENT_KWARGS` (RedisCluster's own arguments) apply. Reads and
    writes both go to the primary that owns the key's slot (django-redis's replica LOCATIONs
    do not apply: a cluster's replicas are its own).
    """

    def connect(self, index: int = 0) -> RedisCluster:
        """The process's RedisCluster for the alias, shared by its threads."""
        return cluster(*self._cluster_arguments())

    def connect_afresh(self) -> RedisCluster:
        """A RedisCluster of the caller's own, with its own connection pools: the Redis
        store's heartbeat thread under gevent, where the shared one's sockets are the
        greenlets'."""
        urls, options = self._cluster_arguments()
        return _new_cluster(urls, options)

    def _cluster_arguments(self) -> tuple[list[str], dict[str, Any]]:
        urls = list(self._server)
        for url in urls:
            database = urlsplit(url).path.strip("/")
            if database not in ("", "0"):
                raise ImproperlyConfigured(
                    f"{url!r}: a Redis Cluster has database 0 only. Drop the /{database} from"
                    " the LOCATION and keep caches apart with KEY_PREFIX instead."
                )
        params = self.connection_factory.make_connection_params(urls[0])
        params.pop("url")
        params.pop("parser_class", None)  # RedisCluster picks its own per node.
        options = {
            **params,
            **self._options.get("CONNECTION_POOL_KWARGS", {}),
            **self._options.get("REDIS_CLIENT_KWARGS", {}),
        }
        return urls, options

    def disconnect(self, index: int = 0, client: Any = None) -> None:
        """Nothing: the cluster's connections are shared by the whole process."""

    def get_many(
        self, keys: Collection[str], version: int | None = None, client: Any = None
    ) -> Any:
        # MGET needs every key in one slot; a cluster client reads them slot by slot.
        if client is None:
            client = self.get_client(write=False)
        if not keys:
            return {}
        names = {self.make_key(key, version=version): key for key in keys}
        values = client.mget_nonatomic(list(names))
        return {
            names[name]: self.decode(value)
            for name, value in zip(names, values, strict=True)
            if value is not None
        }


def cluster(urls: list[str], options: dict[str, Any]) -> RedisCluster:
    """The process's RedisCluster for these startup nodes and options, made once."""
    identity = (tuple(urls), tuple(sorted((name, repr(value)) for name, value in options.items())))
    found = _clusters.get(identity)
    if found is None:
        with _lock:
            found = _clusters.get(identity)
            if found is None:
                found = _clusters[identity] = _new_cluster(urls, options)
    return found


def _new_cluster(urls: list[str], options: dict[str, Any]) -> RedisCluster:
    others = [_node(url) for url in urls[1:]]
    return RedisCluster.from_url(urls[0], startup_nodes=others, **options)


def _node(url: str) -> ClusterNode:
    parts = urlsplit(url)
    return ClusterNode(parts.hostname or "127.0.0.1", parts.port or 6379)  # type: ignore[no-untyped-call]
