"""`memosfs.shared` is `memosfs.client.shared` (the name earlier releases used)."""

import sys

from memosfs.client import shared as _module

sys.modules[__name__] = _module
