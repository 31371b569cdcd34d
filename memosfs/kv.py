"""`memosfs.kv` is `memosfs.client.kv` (the name earlier releases used)."""

import sys

from memosfs.client import kv as _module

sys.modules[__name__] = _module
