import sys

from memosfs.cli import main

sys.exit(main())
