"""Federated-learning aggregation on the same store (docs/federated.md).

The package has two sides that do not import each other:

  client side   tensors.py (safetensors, clipping, noise, fixed point), crypto.py
                (keys, pairwise masks, CKKS), config.py (config, epsilon accounting),
                client.py (make_update, FedClient and its transports);
  job engine    state.py (key-value stores, job records, the job table), tree.py (the
                `.federated` tree's attributes and contents), rounds.py (validation and
                aggregation), engine.py (FederatedJobs, the facade fs.py serves);

errors.py (FedError, the `memosfs.federated` logger) is shared.  Importing this
package gives the client's public API below; the engine is imported from
memosfs.federated.engine.
"""

from memosfs.federated.client import (InprocTransport, PathTransport, FedClient,
                                      decrypted_sum_bytes, make_update)
from memosfs.federated.config import (MODES, epsilon_for, format_config, parse_config)
from memosfs.federated.crypto import (HE_AVAILABLE, generate_keypair, he_decrypt,
                                      he_encrypt, he_keygen, mask_update, pair_mask,
                                      parse_public_key, peers_digest, public_key_bytes)
from memosfs.federated.errors import FedError
from memosfs.federated.tensors import (clip_gradients, decode_fixed, encode_fixed,
                                       global_norm, noise_injection, st_load, st_save)

__all__ = [
    "FedError", "clip_gradients", "noise_injection", "global_norm",
    "encode_fixed", "decode_fixed", "generate_keypair", "public_key_bytes",
    "parse_public_key", "pair_mask", "mask_update", "peers_digest",
    "HE_AVAILABLE", "he_keygen", "he_encrypt", "he_decrypt",
    "make_update", "decrypted_sum_bytes", "FedClient", "InprocTransport",
    "PathTransport", "MODES", "epsilon_for", "parse_config", "format_config",
    "st_load", "st_save",
]
