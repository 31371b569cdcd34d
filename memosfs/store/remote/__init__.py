"""The remote tier: slots on a Redis Cluster that several mounts share.

    remote=redis://[user:pass@]host:port[,host:port...][?opts]    (url.py)

One version of a slot is a manifest and, past one chunk, chunks, all under
one hash tag (wire.py); a write replaces the manifest in one MULTI/EXEC and a
reader sees a whole old version or a whole new one (tier.py, reads.py);
every upload and deletion is announced on a channel, and a strong-mode
writer waits for the live peers' acknowledgements (pubsub.py); uploads run
behind the caller in a queue (writebehind.py); node failures are skipped
for a back-off period and never raise (cluster.py).

Modules, each one seam; an arrow is "may import":

    url.py          RemoteConfig, parse_url, the prefix, acl_rules,
                    hide_url_passwords                    -> nothing of memosfs
    wire.py         key names, RemoteVersion / RemoteEntry, manifest
                    encode / parse, checksums              -> url, _native
    cluster.py      ClusterMixin: connections, node health, failover,
                    counters and warnings, check() / RemoteRefused -> url, wire
    pubsub.py       PubSubMixin: versions told, announcements, acks -> wire
    writebehind.py  WriteBehindMixin: the upload / deletion queue -> wire
    reads.py        ReadMixin: stat, stat_many, get, get_into, names
                                                           -> cluster, wire, _native
    tier.py         RemoteTier (the facade: state, lifecycle, statistics,
                    put_sync, delete_sync), built on the four mixins -> all above

The mixins share the state RemoteTier.__init__ creates (each module's
docstring says which part it owns) and call one another only through self.
Everything other code imports comes from here: `from memosfs.store.remote
import RemoteTier, parse_url, ...`.  One logger for all: memosfs.store.remote.
"""

from memosfs.store.remote.cluster import (DOWN_MAX_S, DOWN_MIN_S, HEARTBEAT_S, PEER_TTL_S,
                                          REFRESH_MIN_S, WARN_EVERY_S, RemoteRefused)
from memosfs.store.remote.pubsub import KNOWN_MAX, PING_S
from memosfs.store.remote.tier import RemoteTier
from memosfs.store.remote.url import (ACL_COMMANDS, CHUNK_MAX, RemoteConfig, acl_rules,
                                      hide_url_passwords, parse_url)
from memosfs.store.remote.wire import (ACK_CHANNEL, CHANNEL, CHUNK_TTL_S, FIXED, JSON_MAX,
                                       MAGIC, PEERS_KEY, PIPE_BYTES, PROBE, TOMBSTONE_TTL_S,
                                       RemoteEntry, RemoteVersion, chunk_key, encode_header,
                                       index_key, manifest_key, parse_header)
from memosfs.store.remote.writebehind import Source

__all__ = ["RemoteTier", "RemoteEntry", "RemoteVersion", "RemoteConfig", "RemoteRefused",
           "parse_url", "manifest_key", "chunk_key", "acl_rules", "hide_url_passwords",
           "CHUNK_MAX",
           # the wire format and the tier's constants, as the single module had them
           "index_key", "encode_header", "parse_header", "Source", "ACL_COMMANDS",
           "MAGIC", "FIXED", "PROBE", "JSON_MAX", "CHUNK_TTL_S", "TOMBSTONE_TTL_S", "CHANNEL",
           "ACK_CHANNEL", "PEERS_KEY", "PIPE_BYTES", "HEARTBEAT_S", "PEER_TTL_S", "PING_S",
           "WARN_EVERY_S", "KNOWN_MAX", "DOWN_MIN_S", "DOWN_MAX_S", "REFRESH_MIN_S"]
